package sqlfence_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The effects that fn adds are written, live, by the commit, after its
// claim (sent with its values bound or written in as literals, lib/pq's
// path): every row of every Add. A COMMIT that fn sends itself records
// none of them.
func TestCommitRecordsOutboxRows(t *testing.T) {
	_, db := newDB(t)
	ctx := testCtx(t)
	for _, literal := range []bool{false, true} {
		s := newStore(t, db)
		name := "bound"
		if literal {
			sqlfence.SendLiterals(s)
			name = "literal"
		}
		add := func(ctx context.Context, tx *sql.Tx) error {
			if err := outbox.Add(ctx, tx, outbox.Effect{Destination: "d", Key: name + "-1"}); err != nil {
				return err
			}
			return outbox.Add(ctx, tx, outbox.Effect{Destination: "d", Key: name + "-2"}, outbox.Effect{Destination: "d", Key: name + "-3"})
		}
		l := guardtest.Lease{Resource: "r-" + name, Tok: 1, Who: "a"}
		_, err := guard.Exec(ctx, s, l, add)
		require.NoError(t, err, name)
		assert.EqualValues(t, 3, count(t, db, "SELECT count(*) FROM fencelock.outbox WHERE resource = $1 AND dead_at IS NULL AND last_error IS NULL", l.Resource), name)

		l.Resource += "-raw"
		_, err = guard.Exec(ctx, s, l, func(ctx context.Context, tx *sql.Tx) error {
			if err := add(ctx, tx); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, "COMMIT")
			return err
		})
		require.ErrorIs(t, err, guard.ErrTxEnded, name)
		assert.EqualValues(t, 0, count(t, db, "SELECT count(*) FROM fencelock.outbox WHERE resource = $1", l.Resource), name)
	}
}
