package pgfence

import (
	"context"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/jackc/pgx/v5"
)

// Prune deletes applied idempotency keys and finished runs older than
// olderThan, and returns how many rows it deleted. A batch retried after
// its key was pruned is applied again: keep olderThan well above the
// longest time a retry can come. The fence rows (tokens) are never pruned:
// they are what rejects stale holders. olderThan must not be negative.
func (s *Store) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: Prune: negative age %v", guard.ErrInvalidInput, olderThan)
	}
	var n int64
	err := s.db.QueryRow(ctx, "SELECT fencelock.prune($1 * interval '1 microsecond')", pgx.QueryExecModeExec, olderThan.Microseconds()).Scan(&n)
	if err != nil {
		if isReadOnly(err) {
			return 0, readOnlyError(ctx, s.db)
		}
		return 0, mapError(err)
	}
	return n, nil
}
