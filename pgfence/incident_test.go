package pgfence_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pausedView is a lock as a paused process sees it when it wakes up: it
// runs on before its own timers fire, so it has not noticed that the lease
// ran out. Only the database can stop its write.
type pausedView struct{ l *fence.Lock }

func (p pausedView) Name() string   { return p.l.Name() }
func (p pausedView) Token() int64   { return p.l.Token() }
func (p pausedView) Holder() string { return p.l.Holder() }

// Compile-time: a *fence.Lock is a guard.Lease, by its method set.
var _ guard.Lease = (*fence.Lock)(nil)

func newFence(t *testing.T) (a, b *fence.Client) {
	t.Helper()
	rds := testenv.NewRedis(t)
	mk := func() *fence.Client {
		c, err := fence.New(rds.Client(), fence.WithPrefix(rds.Prefix))
		require.NoError(t, err)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.Close(ctx)
		})
		return c
	}
	// Two clients: two worker processes.
	return mk(), mk()
}

const leaseA = 300 * time.Millisecond

// The incident, end to end, with real Redis locks: A takes the lock with
// a fixed lease (no renewals), starts its batch and is paused past its
// lease; B takes the lock with a higher token and writes the batch; A
// wakes up and writes: its whole transaction is rejected, nothing of it is
// visible, B's rows are intact. A later legitimate holder retrying the
// batch with the same key adds no second copy.
func TestIncidentEndToEnd(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	workerA, workerB := newFence(t)
	const name = "stock-sync:eu"

	la, err := workerA.Acquire(ctx, name, fence.WithFixedLease(leaseA))
	require.NoError(t, err)
	require.NoError(t, s.Advance(ctx, la))
	// A reads the batch, then is paused: no progress, no renewals. B
	// waits for the lock meanwhile and gets it once A's lease expired.
	lb, err := workerB.Acquire(ctx, name, fence.WithFixedLease(time.Minute))
	require.NoError(t, err)
	require.Greater(t, lb.Token(), la.Token())
	require.NoError(t, s.Advance(ctx, lb))
	_, err = guard.Exec(ctx, s, lb, insertStock("B", 3), guard.WithKey("batch-7"))
	require.NoError(t, err)

	// A wakes up and writes its copy of the batch, with several
	// statements in one transaction.
	_, err = guard.Exec(ctx, s, pausedView{la}, insertStock("A", 3))
	var se *guard.StaleTokenError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, guard.StaleTokenError{Resource: name, Token: la.Token(), Current: lb.Token()}, *se)
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "A"), "nothing of A's transaction is visible")
	assert.EqualValues(t, 3, rowsBy(t, db.Pool, "B"), "B's rows are intact")

	// Once A's own lock has noticed the loss, guard does not even start.
	select {
	case <-la.Done():
	case <-ctx.Done():
		t.Fatal("A's lock never reported the loss of its fixed lease")
	}
	_, err = guard.Exec(ctx, s, la, insertStock("A", 3))
	require.ErrorIs(t, err, guard.ErrLeaseLost)
	require.ErrorIs(t, err, fence.ErrLockLost)
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "A"))

	// B finishes; C, a later legitimate holder, retries the same batch.
	require.NoError(t, lb.Release(ctx))
	lc, err := workerA.Acquire(ctx, name, fence.WithFixedLease(time.Minute))
	require.NoError(t, err)
	defer lc.Release(context.Background())
	require.NoError(t, s.Advance(ctx, lc))
	_, err = guard.Exec(ctx, s, lc, insertStock("C", 3), guard.WithKey("batch-7"))
	require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "C"))
	assert.EqualValues(t, 3, rowsBy(t, db.Pool, "B"))
	assert.EqualValues(t, lc.Token(), storedToken(t, db.Pool, name))
}

// The window where the old holder writes before the new holder's first
// write: without Advance the database has not heard of B yet and accepts
// A (A's write is then ordered before B's, and B's idempotency key keeps
// the batch single); with Advance on acquire, A is rejected.
func TestIncidentWriteBeforeNewHoldersFirstWrite(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	workerA, workerB := newFence(t)
	const name = "stock-sync:us"

	la, err := workerA.Acquire(ctx, name, fence.WithFixedLease(leaseA))
	require.NoError(t, err)
	lb, err := workerB.Acquire(ctx, name, fence.WithFixedLease(time.Minute))
	require.NoError(t, err)
	defer lb.Release(context.Background())
	require.NoError(t, s.Advance(ctx, lb), "B claims right after acquiring")

	// A wakes up and writes before B's first write.
	_, err = guard.Exec(ctx, s, pausedView{la}, insertStock("A", 2), guard.WithKey("batch-1"))
	var se *guard.StaleTokenError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, lb.Token(), se.Current)
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "A"))
	assert.EqualValues(t, 0, count(t, db.Pool, "SELECT count(*) FROM fencelock.applied"), "A's key is not recorded")

	_, err = guard.Exec(ctx, s, lb, insertStock("B", 2), guard.WithKey("batch-1"))
	require.NoError(t, err)
	assert.EqualValues(t, 2, rowsBy(t, db.Pool, "B"))
}

// A is paused in the middle of its transaction (rows written, not
// committed) past its lease. The fence is claimed only at commit, so A's
// open transaction holds up no one: B takes the lock and commits the batch
// while A is still paused. When A wakes up, its lock has reported the
// loss, guard has cancelled the transaction's context, and A's rows are
// rolled back.
func TestIncidentPausedMidTransaction(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	workerA, workerB := newFence(t)
	const name = "stock-sync:apac"

	// A longer lease here: A must get its rows written before it runs out.
	la, err := workerA.Acquire(ctx, name, fence.WithFixedLease(time.Second))
	require.NoError(t, err)
	require.NoError(t, s.Advance(ctx, la))
	wrote, resume := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := guard.Exec(ctx, s, la, func(ctx context.Context, tx pgx.Tx) error {
			if err := insertStock("A", 2)(ctx, tx); err != nil {
				return err
			}
			close(wrote)
			<-resume // paused
			return insertStock("A", 1)(ctx, tx)
		}, guard.WithKey("batch-1"))
		aDone <- err
	}()
	select {
	case <-wrote:
	case err := <-aDone:
		t.Fatalf("A could not write before its lease ran out (machine too slow?): %v", err)
	}

	lb, err := workerB.Acquire(ctx, name, fence.WithFixedLease(time.Minute))
	require.NoError(t, err)
	defer lb.Release(context.Background())
	bDone := make(chan error, 1)
	go func() {
		if err := s.Advance(ctx, lb); err != nil {
			bDone <- err
			return
		}
		_, err := guard.Exec(ctx, s, lb, insertStock("B", 3), guard.WithKey("batch-1"))
		bDone <- err
	}()

	// B commits while A is still paused (the bound only turns a hang into
	// a failure).
	select {
	case err := <-bDone:
		require.NoError(t, err)
	case err := <-aDone:
		t.Fatalf("A returned while paused: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("B waited for A's open transaction")
	}
	assert.EqualValues(t, 3, rowsBy(t, db.Pool, "B"))
	close(resume)
	err = <-aDone
	require.ErrorIs(t, err, guard.ErrLeaseLost)
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "A"))
	assert.EqualValues(t, 3, rowsBy(t, db.Pool, "B"))
}

// A process frozen in the middle of its transaction cannot react to
// anything; its lock cannot tell it. A guarded write to an unprotected
// table holds no fence lock until commit (TestFrozenHolderDoesNotBlockNext),
// but a write to a table protected with Protect locks the fence row until
// the transaction ends, so the next holder's claim waits for the frozen
// one. With WithIdleTimeout the database ends the frozen transaction, so B
// does not wait for A to wake up, and A's rows are never visible. With
// WithLockTimeout a waiting claim gives up with guard.ErrFenceBusy instead of
// waiting for the frozen one.
func TestIncidentFrozenMidTransaction(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	workerA, workerB := newFence(t)
	const name = "stock-sync:latam"
	sA := newStore(t, db.Pool, pgstore.WithIdleTimeout(500*time.Millisecond))
	sB := newStore(t, db.Pool, pgstore.WithLockTimeout(50*time.Millisecond))
	sC := newStore(t, db.Pool)

	require.NoError(t, sC.Protect(ctx, "stock", pgfence.ForResource(name)))

	la, err := workerA.Acquire(ctx, name, fence.WithFixedLease(leaseA))
	require.NoError(t, err)
	require.NoError(t, sA.Advance(ctx, la))
	wrote, resume := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		// Frozen: no Done channel to react to.
		_, err := guard.Exec(ctx, sA, pausedView{la}, func(ctx context.Context, tx pgx.Tx) error {
			if err := insertStock("A", 2)(ctx, tx); err != nil {
				return err
			}
			close(wrote)
			<-resume
			return insertStock("A", 1)(ctx, tx)
		})
		aDone <- err
	}()
	select {
	case <-wrote:
	case err := <-aDone:
		t.Fatalf("A failed before its pause: %v", err)
	}

	lb, err := workerB.Acquire(ctx, name, fence.WithFixedLease(time.Minute))
	require.NoError(t, err)
	defer lb.Release(context.Background())
	// B's impatient store gives up while A's transaction holds the row
	// (unless a very slow machine let the database end A first)...
	_, err = guard.Exec(ctx, sB, lb, insertStock("B", 3), guard.WithKey("batch-1"))
	impatientCommitted := err == nil
	if err != nil {
		require.ErrorIs(t, err, guard.ErrFenceBusy)
	}
	// ...and the patient one gets through once the database has ended A's
	// frozen transaction, without A waking up.
	_, err = guard.Exec(ctx, sC, lb, insertStock("B", 3), guard.WithKey("batch-1"))
	if impatientCommitted {
		require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	} else {
		require.NoError(t, err)
	}
	close(resume)
	require.Error(t, <-aDone, "A's session was ended by the database")
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "A"))
	assert.EqualValues(t, 3, rowsBy(t, db.Pool, "B"))
	_, err = guard.Exec(ctx, sC, pausedView{la}, insertStock("A", 3))
	require.ErrorIs(t, err, guard.ErrStaleToken)
}
