package sqlfence_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wireConn counts the client's writes to the server (pgx sends each round
// trip's messages in one write) and can drop the connection right after a
// chosen message went out.
type wireConn struct {
	net.Conn
	w *wire
}

type wire struct {
	writes atomic.Int64
	mu     sync.Mutex
	// cutAfter, when set, closes the connection just after a write that
	// contains it has been sent.
	cutAfter []byte
}

func (c wireConn) Write(b []byte) (int, error) {
	c.w.writes.Add(1)
	n, err := c.Conn.Write(b)
	c.w.mu.Lock()
	cut := c.w.cutAfter != nil && bytes.Contains(b, c.w.cutAfter)
	if cut {
		c.w.cutAfter = nil
	}
	c.w.mu.Unlock()
	if cut {
		_ = c.Conn.Close()
	}
	return n, err
}

// wiredDB opens a *sql.DB through pgx's driver whose connections report to
// w, limited to one connection so round trips are counted on one wire.
func wiredDB(t *testing.T, url string, w *wire) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wireConn{Conn: c, w: w}, nil
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// The round trips of a guarded one-row write over database/sql, counted on
// the wire: database/sql sends BEGIN and COMMIT on its own, so the check
// (open) and the claim (close) are one statement each, next to them; the
// advance goes out only for a token this Store has not seen stored.
func TestRoundTrips(t *testing.T) {
	tdb, _ := newDB(t)
	ctx := testCtx(t)
	var w wire
	db := wiredDB(t, tdb.URL, &w)
	mustExec(t, db, "CREATE TABLE stock (sku text, writer text)")
	s := newStore(t, db)
	plain := func() {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, insert("p")(ctx, tx))
		require.NoError(t, tx.Commit())
	}
	guarded := func(l guardtest.Lease, opts ...guard.Option) func() {
		return func() {
			_, err := guard.Exec(ctx, s, l, insert("g"), opts...)
			require.NoError(t, err)
		}
	}
	roundTrips := func(f func()) int64 {
		before := w.writes.Load()
		f()
		return w.writes.Load() - before
	}
	// Warm up: pgx prepares and caches each statement on first use.
	plain()
	guarded(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"})()
	guarded(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, guard.WithKey("warm"))()

	p := roundTrips(plain)
	assert.EqualValues(t, 3, p, "plain: BEGIN, INSERT, COMMIT")
	assert.Equal(t, p+2, roundTrips(guarded(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"})), "guarded: BEGIN, open, INSERT, close, COMMIT")
	assert.Equal(t, p+2, roundTrips(guarded(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, guard.WithKey("k"))), "guarded with a key")
	assert.Equal(t, p+3, roundTrips(guarded(guardtest.Lease{Resource: "r", Tok: 2, Who: "b"})), "a new token: advance first")
}

// A connection lost while COMMIT is in flight: the server committed, the
// client cannot know; Exec says the outcome is unknown, never that
// nothing was written, and a retry with the same key tells.
func TestCommitInFlightUnknownOutcome(t *testing.T) {
	tdb, _ := newDB(t)
	ctx := testCtx(t)
	var w wire
	db := wiredDB(t, tdb.URL, &w)
	mustExec(t, db, "CREATE TABLE stock (sku text, writer text)")
	s := newStore(t, db)
	l := guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}
	_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx *sql.Tx) error {
		w.mu.Lock()
		w.cutAfter = []byte("commit\x00")
		w.mu.Unlock()
		return insert("a")(ctx, tx)
	}, guard.WithKey("k"))
	require.ErrorIs(t, err, guard.ErrUnknownOutcome)
	assert.NotErrorIs(t, err, guard.ErrStaleToken)
	assert.NotContains(t, err.Error(), "\n")
	require.Eventually(t, func() bool {
		return count(t, openDB(t, "pgx", tdb.URL), "SELECT count(*) FROM stock WHERE writer = 'a'") == 1
	}, time.Minute, 10*time.Millisecond, "the server committed")
	_, err = guard.Exec(ctx, s, l, insert("a"), guard.WithKey("k"))
	require.ErrorIs(t, err, guard.ErrAlreadyApplied, "the retry finds the key applied")
}

// Raw SQL through database/sql gets the same errors through MapError.
func TestMapErrorRawSQL(t *testing.T) {
	_, db := newDB(t)
	ctx := testCtx(t)
	_, err := db.ExecContext(ctx, "SELECT fencelock.claim($1, $2, $3)", "r", 5, "b")
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "SELECT fencelock.claim($1, $2, $3)", "r", 4, "a")
	err = sqlfence.MapError(err)
	var se *guard.StaleTokenError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, guard.StaleTokenError{Resource: "r", Token: 4, Current: 5}, *se)
	assert.ErrorIs(t, err, guard.ErrStaleToken)

	_, err = db.ExecContext(ctx, "SELECT fencelock.claim($1, $2, $3)", "", 4, "a")
	assert.ErrorIs(t, sqlfence.MapError(err), guard.ErrInvalidInput)
	assert.Nil(t, sqlfence.MapError(nil))
	other := errors.New("other")
	assert.Equal(t, other, sqlfence.MapError(other))
}

// A table protected with pgfence's Protect accepts writes through sqlfence
// (its check sets the claim the trigger reads) and refuses a plain
// transaction, typed through the Store's MapError.
func TestProtectedTable(t *testing.T) {
	tdb, db := newDB(t)
	ctx := testCtx(t)
	mustExec(t, db, "CREATE TABLE stock (sku text, writer text)")
	pg, err := pgfence.New(tdb.Pool)
	require.NoError(t, err)
	require.NoError(t, pg.Protect(ctx, "stock"))
	s := newStore(t, db)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insert("a"))
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "INSERT INTO stock VALUES ('x', 'raw')")
	assert.ErrorIs(t, sqlfence.MapError(err), guard.ErrNotClaimed)
	// Overtaken after writing to the protected table: refused.
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx *sql.Tx) error {
		if err := insert("a")(ctx, tx); err != nil {
			return err
		}
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		// The trigger holds the fence row: a newer claim waits for this
		// transaction, so it cannot commit in between.
		_, err := guard.Exec(short, newStore(t, openDB(t, "pgx", tdb.URL)), guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}, insert("b"))
		if err == nil {
			return errors.New("a newer holder committed while the protected write was open")
		}
		return nil
	})
	require.NoError(t, err)
	assert.EqualValues(t, 2, count(t, db, "SELECT count(*) FROM stock WHERE writer = 'a'"))
	assert.EqualValues(t, 0, count(t, db, "SELECT count(*) FROM stock WHERE writer = 'b'"))
}

// The lock timeout rides in the check statement and holds for fn's
// statements; bad options are errors from New.
func TestOptions(t *testing.T) {
	_, db := newDB(t)
	ctx := testCtx(t)
	s := newStore(t, db, pgstore.WithLockTimeout(250*time.Millisecond), pgstore.WithIdleTimeout(time.Minute))
	var lockTimeout, idle string
	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, "SHOW lock_timeout").Scan(&lockTimeout); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&idle)
	})
	require.NoError(t, err)
	assert.Equal(t, "250ms", lockTimeout)
	assert.Equal(t, "1min", idle)
	var after string
	require.NoError(t, db.QueryRowContext(ctx, "SHOW lock_timeout").Scan(&after))
	assert.Equal(t, "0", after, "the setting is the transaction's only")

	for _, o := range []pgstore.Option{nil, pgstore.WithLockTimeout(0), pgstore.WithIdleTimeout(time.Microsecond)} {
		_, err := sqlfence.New(db, o)
		assert.ErrorIs(t, err, guard.ErrInvalidOption)
	}
	_, err = sqlfence.New(db, pgstore.WithoutPreparedStatements())
	require.ErrorIs(t, err, guard.ErrInvalidOption)
	assert.Contains(t, err.Error(), "WithoutPreparedStatements is pgfence's", "it says why")
	_, err = sqlfence.New(nil)
	assert.ErrorIs(t, err, guard.ErrNilDB)
}

// Without the schema every call names the command that installs it.
func TestSchemaMissing(t *testing.T) {
	tdb := testenv.NewDB(t)
	db := openDB(t, "pgx", tdb.URL)
	ctx := testCtx(t)
	s := newStore(t, db)
	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(context.Context, *sql.Tx) error { return nil })
	assert.ErrorIs(t, err, guard.ErrSchemaMissing)
	assert.ErrorIs(t, s.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}), guard.ErrSchemaMissing)
	_, err = s.Prune(ctx, time.Hour)
	assert.ErrorIs(t, err, guard.ErrSchemaMissing)
}

// Prune deletes old keys and finished runs, never tokens.
func TestPrune(t *testing.T) {
	_, db := newDB(t)
	ctx := testCtx(t)
	s := newStore(t, db)
	noop := func(context.Context, *sql.Tx) error { return nil }
	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, noop, guard.WithKey("old"))
	require.NoError(t, err)
	require.NoError(t, s.Run(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, "run").Finish(ctx))
	mustExec(t, db, "UPDATE fencelock.applied SET applied_at = now() - interval '2 hours'")
	mustExec(t, db, "UPDATE fencelock.runs SET finished_at = now() - interval '2 hours'")
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, noop, guard.WithKey("new"))
	require.NoError(t, err)
	n, err := s.Prune(ctx, time.Hour)
	require.NoError(t, err)
	assert.EqualValues(t, 2, n)
	assert.EqualValues(t, 1, count(t, db, "SELECT count(*) FROM fencelock.applied"))
	assert.EqualValues(t, 1, count(t, db, "SELECT count(*) FROM fencelock.fence"))
	_, err = s.Prune(ctx, -time.Second)
	assert.ErrorIs(t, err, guard.ErrInvalidInput)
}
