package pgfence_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// However a lost lease ends Exec or Run.Step, the error matches
// guard.ErrLeaseLost and the lock's own cause, on one line, and nothing
// is visible, also under lock.Context() with the lock lost while fn runs
// (where the driver itself sees only a cancelled context).
func TestLeaseLossIsNamed(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	locks, _ := newFence(t)

	check := func(t *testing.T, err error, cause error, writer string) {
		t.Helper()
		require.ErrorIs(t, err, guard.ErrLeaseLost)
		require.ErrorIs(t, err, cause)
		assert.NotContains(t, err.Error(), "\n")
		checkInvariant(t, err, rowsBy(t, db.Pool, writer))
	}
	// During fn, with a fixed lease that runs out while fn waits: fn's
	// context ends, its next statement fails. ctx is the caller's own, or
	// the lock's context as docs/locks.md suggests.
	for _, viaLockCtx := range []bool{false, true} {
		for _, step := range []bool{false, true} {
			lock, err := locks.Acquire(ctx, "during", fence.WithFixedLease(fence.MinLease))
			require.NoError(t, err)
			execCtx := ctx
			if viaLockCtx {
				execCtx = lock.Context()
			}
			fn := func(ctx context.Context, tx pgx.Tx) error {
				if err := insertStock("during", 1)(ctx, tx); err != nil {
					return err
				}
				<-ctx.Done()
				return insertStock("during", 1)(ctx, tx)
			}
			if step {
				err = s.Run(lock, "run").Step(execCtx, "1", fn)
			} else {
				_, err = guard.Exec(execCtx, s, lock, fn)
			}
			t.Logf("lock ctx %v, step %v: %v", viaLockCtx, step, err)
			check(t, err, fence.ErrLockLost, "during")
		}
	}

	// Before begin: max hold reached.
	lock, err := locks.Acquire(ctx, "before", fence.WithMaxHold(fence.MinLease)) // the shortest accepted
	require.NoError(t, err)
	<-lock.Done()
	_, err = guard.Exec(lock.Context(), s, lock, insertStock("before", 1))
	check(t, err, fence.ErrMaxHold, "before")
	check(t, s.Run(lock, "run").Step(ctx, "1", insertStock("before", 1)), fence.ErrMaxHold, "before")
	assert.Zero(t, storedToken(t, db.Pool, "before"), "no round trip")

	// fn ignores the loss and returns nil: not committed.
	lock, err = locks.Acquire(ctx, "ignored", fence.WithFixedLease(fence.MinLease))
	require.NoError(t, err)
	_, err = guard.Exec(ctx, s, lock, func(ctx context.Context, tx pgx.Tx) error {
		err := insertStock("ignored", 1)(ctx, tx)
		<-lock.Done()
		return err
	})
	check(t, err, fence.ErrLockLost, "ignored")
}

// Exec under the lease's own context (lock.Context(), as the worker
// does): the lease is lost while the commit is on the wire, which
// cancels Exec's ctx too. The commit is not cut short (that would make
// its outcome unknown): nobody newer claimed, so it commits, and Exec
// says so.
func TestLeaseContextLostWhileCommitInFlight(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	const oneWay = 100 * time.Millisecond
	pool, proxy := proxiedPool(t, db)
	proxy.Delay(oneWay)
	s := newStore(t, pool)

	lctx, lose := context.WithCancelCause(context.Background())
	defer lose(nil)
	l := ctxLease{guardtest.Lease{Resource: "r", Tok: 1, Who: "h"}, lctx}
	_, err := guard.Exec(lctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO stock (sku, qty, writer) VALUES ('x', 1, 'w')"); err != nil {
			return err
		}
		time.AfterFunc(oneWay, func() { lose(errLeaseGone) })
		return nil
	})
	require.Error(t, lctx.Err(), "the lease was lost before Exec returned")
	if err != nil {
		// Only if the machine stalled so long that the loss came before
		// the commit was sent.
		require.ErrorIs(t, err, guard.ErrLeaseLost)
		require.NotErrorIs(t, err, guard.ErrUnknownOutcome)
	}
	checkInvariant(t, err, rowsBy(t, db.Pool, "w"))
	_ = ctx
}
