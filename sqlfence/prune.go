package sqlfence

import (
	"context"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/guard"
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
	err := s.db.QueryRowContext(ctx, "SELECT fencelock.prune($1 * interval '1 microsecond')", olderThan.Microseconds()).Scan(&n)
	if err != nil {
		return 0, mapError(err)
	}
	return n, nil
}
