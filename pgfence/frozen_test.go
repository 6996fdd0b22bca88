package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// frozenExec starts guard.Exec for l in a goroutine; fn writes rows as
// writer, reports that on wrote, then freezes until resume is closed and
// writes one row more. The lease has no Done channel: a frozen process
// cannot react to anything, so only the database can stop it.
func frozenExec(ctx context.Context, t *testing.T, s guard.Store[pgx.Tx], l guardtest.Lease, writer string, opts ...guard.Option) (resume chan struct{}, done <-chan error) {
	t.Helper()
	wrote, resume := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
			if err := insertStock(writer, 2)(ctx, tx); err != nil {
				return err
			}
			close(wrote)
			<-resume
			_, err := tx.Exec(ctx, "INSERT INTO stock (sku, qty, writer) VALUES ('late', 1, $1)", writer)
			return err
		}, opts...)
		errc <- err
	}()
	select {
	case <-wrote:
	case err := <-errc:
		t.Fatalf("%s failed before freezing: %v", writer, err)
	}
	return resume, errc
}

// notDone fails the test if the frozen holder's Exec has returned: what
// the test asserts must happen while it is still frozen.
func notDone(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s: the frozen holder's Exec returned (%v) before it was released", what, err)
	default:
	}
}

// bounded is a context for the calls of the next holder: generous, so a
// slow machine passes, but a next holder blocked by the frozen one fails
// the test instead of hanging it.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A holder frozen in the middle of its transaction (rows written, not
// committed) holds no lock the next holder needs: B advances and writes
// while A is still frozen. When A thaws, its commit-time claim is refused,
// nothing of it is visible, and B's rows are intact.
func TestFrozenHolderDoesNotBlockNext(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	a, b := guardtest.Lease{Resource: "r", Tok: 10, Who: "a"}, guardtest.Lease{Resource: "r", Tok: 11, Who: "b"}
	require.NoError(t, s.Advance(ctx, a))

	resume, aDone := frozenExec(ctx, t, s, a, "A")

	// While A is frozen: B's Advance and guarded write complete.
	bctx := bounded(t)
	require.NoError(t, s.Advance(bctx, b), "B's Advance waited for the frozen holder")
	_, err := guard.Exec(bctx, s, b, insertStock("B", 3))
	require.NoError(t, err, "B's write waited for the frozen holder")
	notDone(t, aDone, "B committed")
	assert.EqualValues(t, 3, rowsBy(t, db.Pool, "B"))
	assert.EqualValues(t, 11, storedToken(t, db.Pool, "r"))

	close(resume)
	err = <-aDone
	var se *guard.StaleTokenError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, guard.StaleTokenError{Resource: "r", Token: 10, Current: 11}, *se)
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "A"), "nothing of A is visible")
	assert.EqualValues(t, 3, rowsBy(t, db.Pool, "B"), "B's rows are intact")
	assert.EqualValues(t, 11, storedToken(t, db.Pool, "r"))
	assert.Equal(t, "b", holderOf(t, db.Pool, "r"))
}

// The same with an idempotency key: A and B carry the same batch key; A
// freezes with the batch written, B applies it. A's commit must not add a
// second copy: it is refused as stale (a newer holder), or as applied
// (the same holder retrying concurrently, whose token the claim accepts).
func TestFrozenHolderSameKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b guardtest.Lease
		want error
	}{
		{"newer holder", guardtest.Lease{Resource: "r", Tok: 10, Who: "a"}, guardtest.Lease{Resource: "r", Tok: 11, Who: "b"}, guard.ErrStaleToken},
		{"same holder retrying", guardtest.Lease{Resource: "r", Tok: 10, Who: "a"}, guardtest.Lease{Resource: "r", Tok: 10, Who: "a"}, guard.ErrAlreadyApplied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newDB(t)
			stockTable(t, db.Pool)
			s := newStore(t, db.Pool)
			ctx := testCtx(t)
			require.NoError(t, s.Advance(ctx, tc.a))

			resume, aDone := frozenExec(ctx, t, s, tc.a, "A", guard.WithKey("batch-7"))
			bctx := bounded(t)
			require.NoError(t, s.Advance(bctx, tc.b))
			_, err := guard.Exec(bctx, s, tc.b, insertStock("B", 2), guard.WithKey("batch-7"))
			require.NoError(t, err)
			notDone(t, aDone, "B committed")

			close(resume)
			err = <-aDone
			require.ErrorIs(t, err, tc.want)
			assert.EqualValues(t, 0, rowsBy(t, db.Pool, "A"), "no second copy")
			assert.EqualValues(t, 2, rowsBy(t, db.Pool, "B"))
			assert.EqualValues(t, 1, count(t, db.Pool, "SELECT count(*) FROM fencelock.applied WHERE key = 'batch-7' AND token = $1", tc.b.Tok))
		})
	}
}

// ctxLease is a lease that reports its loss like *fence.Lock: a context,
// a Done channel and an Err.
type ctxLease struct {
	guardtest.Lease
	ctx context.Context
}

func (l ctxLease) Context() context.Context { return l.ctx }
func (l ctxLease) Done() <-chan struct{}    { return l.ctx.Done() }
func (l ctxLease) Err() error               { return context.Cause(l.ctx) }

// doneLease reports its loss with Done and Err only (no Context): Exec
// watches it with a goroutine instead of a context callback.
type doneLease struct{ ctxLease }

func (doneLease) Context() {}

var errLeaseGone = errors.New("test: lease lost")

// The lease is lost while the COMMIT is in flight (a proxy delays every
// packet, so the commit takes a while on the wire). Exec must not cut the
// commit short, which would report an error for a transaction the server
// committed. Whatever the timing, Exec's answer and the database agree:
// nil if and only if the row is there.
func TestLeaseLostWhileCommitInFlight(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	const oneWay = 100 * time.Millisecond
	proxy, err := testenv.NewProxy(db.Server.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	host, port, _ := net.SplitHostPort(proxy.Addr)
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pool.Ping(ctx)) // connect before the delay
	proxy.Delay(oneWay)
	s := newStore(t, pool)

	lostDuringCommit := 0
	// Loss at a fraction of the commit's round trip (2*oneWay) after fn
	// returns: before the COMMIT reaches the server, around it, and while
	// the answer travels back.
	for i, after := range []time.Duration{oneWay / 2, oneWay, 3 * oneWay / 2} {
		writer := fmt.Sprintf("w%d", i)
		lctx, lose := context.WithCancelCause(context.Background())
		var l guard.Lease = ctxLease{guardtest.Lease{Resource: "r", Tok: int64(i + 1), Who: "h"}, lctx}
		if i%2 == 1 {
			l = doneLease{ctxLease{guardtest.Lease{Resource: "r", Tok: int64(i + 1), Who: "h"}, lctx}}
		}
		var timer *time.Timer
		_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO stock (sku, qty, writer) VALUES ('x', 1, $1)", writer); err != nil {
				return err
			}
			timer = time.AfterFunc(after, func() { lose(errLeaseGone) })
			return nil
		})
		lostBeforeReturn := lctx.Err() != nil
		timer.Stop()
		lose(nil)
		visible := rowsBy(t, db.Pool, writer)
		t.Logf("loss %v after fn: err=%v, lost before Exec returned=%v, rows=%d", after, err, lostBeforeReturn, visible)
		if err == nil {
			assert.EqualValues(t, 1, visible, "%s: Exec returned nil but the row is not there", writer)
		} else {
			assert.EqualValues(t, 0, visible, "%s: Exec returned %v but the row was committed", writer, err)
		}
		if lostBeforeReturn && err == nil {
			lostDuringCommit++
		}
	}
	// Nobody else claimed: a commit under way when the lease was lost
	// goes through (the database saw no newer token), and that happened.
	assert.Positive(t, lostDuringCommit, "no trial lost the lease while the commit was in flight; the test proved nothing")

	// A newer holder claimed while fn ran, and the lease is lost while the
	// commit is in flight: the claim refuses, nothing is visible, and the
	// error says both (stale, and the lease was lost by the time Exec
	// returned).
	lctx, lose := context.WithCancelCause(context.Background())
	defer lose(nil)
	old := ctxLease{guardtest.Lease{Resource: "r", Tok: 10, Who: "old"}, lctx}
	_, err = guard.Exec(ctx, s, old, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO stock (sku, qty, writer) VALUES ('x', 1, 'old')"); err != nil {
			return err
		}
		if err := newStore(t, db.Pool).Advance(ctx, guardtest.Lease{Resource: "r", Tok: 11, Who: "new"}); err != nil {
			return err
		}
		time.AfterFunc(oneWay/2, func() { lose(errLeaseGone) })
		return nil
	})
	// Normally the loss lands while the commit is in flight and the claim
	// refuses it (stale); on a stalled machine it may land before the
	// commit is sent, and guard refuses it first. Either way nothing is
	// visible and the error says the lease was lost.
	require.ErrorIs(t, err, guard.ErrLeaseLost)
	require.ErrorIs(t, err, errLeaseGone)
	var se *guard.StaleTokenError
	if errors.As(err, &se) {
		assert.EqualValues(t, 11, se.Current)
	} else {
		t.Logf("the loss was seen before the commit was sent: %v", err)
	}
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "old"))
}

// A read-modify-write: the old holder reads, then freezes; the next holder
// (no Advance of its own) begins and reads while the old one is frozen;
// the old one thaws and commits first. Its commit must be refused, or the
// next holder's increment, computed from the value it read, would
// overwrite the old one's: a lost update. The begin round trip records the
// next holder's token in a transaction of its own, so the old holder's
// commit-time claim sees it.
func TestReadModifyWriteNoLostUpdate(t *testing.T) {
	db := newDB(t)
	ctx := testCtx(t)
	mustExec(t, db.Pool, "CREATE TABLE reg (id int PRIMARY KEY, value int NOT NULL)")
	mustExec(t, db.Pool, "INSERT INTO reg VALUES (1, 0)")
	s := newStore(t, db.Pool)
	incr := func(read chan<- struct{}, proceed <-chan struct{}) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			var v int
			if err := tx.QueryRow(ctx, "SELECT value FROM reg WHERE id = 1").Scan(&v); err != nil {
				return err
			}
			close(read)
			<-proceed
			_, err := tx.Exec(ctx, "UPDATE reg SET value = $1 WHERE id = 1", v+1)
			return err
		}
	}
	run := func(l guardtest.Lease) (read, proceed chan struct{}, done chan error) {
		read, proceed, done = make(chan struct{}), make(chan struct{}), make(chan error, 1)
		go func() {
			_, err := guard.Exec(ctx, s, l, incr(read, proceed))
			done <- err
		}()
		return read, proceed, done
	}
	oldRead, oldGo, oldDone := run(guardtest.Lease{Resource: "reg", Tok: 1, Who: "old"})
	<-oldRead
	nextRead, nextGo, nextDone := run(guardtest.Lease{Resource: "reg", Tok: 2, Who: "next"})
	select {
	case <-nextRead:
	case err := <-nextDone:
		t.Fatalf("next holder failed: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("next holder waited for the frozen one")
	}
	close(oldGo)
	oldErr := <-oldDone
	close(nextGo)
	nextErr := <-nextDone

	var se *guard.StaleTokenError
	require.ErrorAs(t, oldErr, &se, "the old holder committed over the next holder's read")
	assert.EqualValues(t, 2, se.Current)
	require.NoError(t, nextErr)
	assert.EqualValues(t, 1, count(t, db.Pool, "SELECT value FROM reg WHERE id = 1"), "one increment committed, one in the register")
}
