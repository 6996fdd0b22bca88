package pgfence_test

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Advance refuses a released, lost or closed lock exactly as Exec does: a
// *guard.LeaseLostError matching the lock's own cause, and nothing stored.
func TestAdvanceRefusesEndedLock(t *testing.T) {
	db := newDB(t)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	locks, other := newFence(t)

	for _, tc := range []struct {
		name  string
		end   func(l *fence.Lock)
		cause error
	}{
		{"released", func(l *fence.Lock) { require.NoError(t, l.Release(ctx)) }, fence.ErrReleased},
		{"lost", func(l *fence.Lock) { <-l.Done() }, fence.ErrLockLost},
		{"closed", func(*fence.Lock) { require.NoError(t, other.Close(ctx)) }, fence.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := locks
			var opts []fence.LockOption
			switch tc.name {
			case "lost":
				opts = append(opts, fence.WithFixedLease(fence.MinLease))
			case "closed":
				c = other
			}
			l, err := c.Acquire(ctx, "adv-"+tc.name, opts...)
			require.NoError(t, err)
			tc.end(l)
			advErr := s.Advance(ctx, l)
			_, execErr := guard.Exec(ctx, s, l, func(context.Context, pgx.Tx) error { return nil })
			for _, err := range []error{advErr, execErr} {
				require.ErrorIs(t, err, guard.ErrLeaseLost)
				require.ErrorIs(t, err, tc.cause)
				var ll *guard.LeaseLostError
				require.ErrorAs(t, err, &ll)
			}
			assert.Equal(t, execErr.Error(), advErr.Error(), "the same refusal, the same message")
			var n int64
			require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM fencelock.fence WHERE resource = $1", "adv-"+tc.name).Scan(&n))
			assert.Zero(t, n, "nothing stored for an ended lock")
		})
	}
}
