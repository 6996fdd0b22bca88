package pgfence_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// insertStock returns an fn that writes n stock rows as writer.
func insertStock(writer string, n int) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		for i := 0; i < n; i++ {
			// An explicit exec mode, as fn must use behind a transaction
			// pooler (these tests also run through PgBouncer).
			if _, err := tx.Exec(ctx, "INSERT INTO stock (sku, qty, writer) VALUES ($1, $2, $3)", pgx.QueryExecModeExec, "sku-"+string(rune('a'+i)), i, writer); err != nil {
				return err
			}
		}
		return nil
	}
}

func rowsBy(t *testing.T, pool *pgxpool.Pool, writer string) int64 {
	t.Helper()
	return count(t, pool, "SELECT count(*) FROM stock WHERE writer = $1", writer)
}

func TestExecCommitsAndStoresToken(t *testing.T) {
	onBothPaths(t, func(t *testing.T, db *testenv.DB, pool *pgxpool.Pool) {
		stockTable(t, db.Pool)
		s := newStore(t, pool)
		ctx := testCtx(t)

		res, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "stock:eu", Tok: 7, Who: "a"}, insertStock("a", 3), guard.WithKey("batch-1"))
		require.NoError(t, err)
		assert.Equal(t, guard.Result{Resource: "stock:eu", Token: 7, Holder: "a", Key: "batch-1"}, res)
		assert.EqualValues(t, 3, rowsBy(t, db.Pool, "a"))
		assert.EqualValues(t, 7, storedToken(t, db.Pool, "stock:eu"))
		assert.EqualValues(t, 1, count(t, db.Pool, "SELECT count(*) FROM fencelock.applied WHERE resource = 'stock:eu' AND key = 'batch-1' AND token = 7"))

		// A higher token is accepted and stored; the same token from the same
		// holder is accepted again.
		_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "stock:eu", Tok: 9, Who: "b"}, insertStock("b", 1))
		require.NoError(t, err)
		_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "stock:eu", Tok: 9, Who: "b"}, insertStock("b", 1))
		require.NoError(t, err)
		assert.EqualValues(t, 9, storedToken(t, db.Pool, "stock:eu"))
		assert.EqualValues(t, 2, rowsBy(t, db.Pool, "b"))
	})
}

func TestStaleTokenRejectsWholeTransaction(t *testing.T) {
	onBothPaths(t, func(t *testing.T, db *testenv.DB, pool *pgxpool.Pool) {
		stockTable(t, db.Pool)
		s := newStore(t, pool)
		ctx := testCtx(t)

		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 10, Who: "b"}, insertStock("b", 2))
		require.NoError(t, err)

		for _, tc := range []struct {
			name string
			l    guardtest.Lease
		}{
			{"lower token", guardtest.Lease{Resource: "r", Tok: 9, Who: "a"}},
			{"same token, other holder", guardtest.Lease{Resource: "r", Tok: 10, Who: "a"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ran := false
				_, err := guard.Exec(ctx, s, tc.l, func(ctx context.Context, tx pgx.Tx) error {
					ran = true
					return insertStock("a", 5)(ctx, tx)
				})
				require.ErrorIs(t, err, guard.ErrStaleToken)
				var se *guard.StaleTokenError
				require.ErrorAs(t, err, &se)
				assert.Equal(t, guard.StaleTokenError{Resource: "r", Token: tc.l.Tok, Current: 10}, *se)
				assert.False(t, ran, "fn must not run after a refused claim")
				assert.EqualValues(t, 0, rowsBy(t, db.Pool, "a"))
				assert.EqualValues(t, 2, rowsBy(t, db.Pool, "b"))
				assert.EqualValues(t, 10, storedToken(t, db.Pool, "r"))
				assert.Equal(t, "b", holderOf(t, db.Pool, "r"))
			})
		}
		// The pool's connections are clean after the rejections.
		_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 11, Who: "c"}, insertStock("c", 1))
		require.NoError(t, err)
	})
}

func holderOf(t *testing.T, pool *pgxpool.Pool, resource string) string {
	t.Helper()
	var h string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT holder FROM fencelock.fence WHERE resource = $1", resource).Scan(&h))
	return h
}

func TestIdempotencyKey(t *testing.T) {
	onBothPaths(t, func(t *testing.T, db *testenv.DB, pool *pgxpool.Pool) {
		stockTable(t, db.Pool)
		s := newStore(t, pool)
		ctx := testCtx(t)

		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 5, Who: "a"}, insertStock("batch-7", 3), guard.WithKey("batch-7"))
		require.NoError(t, err)

		// A later, legitimate holder retries the same batch: no second copy.
		ran := false
		_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 6, Who: "b"}, func(ctx context.Context, tx pgx.Tx) error {
			ran = true
			return insertStock("batch-7", 3)(ctx, tx)
		}, guard.WithKey("batch-7"))
		require.ErrorIs(t, err, guard.ErrAlreadyApplied)
		assert.Contains(t, err.Error(), "token 5")
		assert.False(t, ran)
		assert.EqualValues(t, 3, rowsBy(t, db.Pool, "batch-7"))

		// The same holder retrying (e.g. after an ambiguous commit) too,
		// while it is still the newest.
		_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 6, Who: "b"}, insertStock("batch-7", 3), guard.WithKey("batch-7"))
		require.ErrorIs(t, err, guard.ErrAlreadyApplied)
		assert.EqualValues(t, 3, rowsBy(t, db.Pool, "batch-7"))

		// Another key, or the same key on another resource, is another batch.
		_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 6, Who: "b"}, insertStock("batch-8", 1), guard.WithKey("batch-8"))
		require.NoError(t, err)
		_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "other", Tok: 1, Who: "b"}, insertStock("other-7", 1), guard.WithKey("batch-7"))
		require.NoError(t, err)

		// A stale holder with a fresh key is refused as stale, and its key is
		// not recorded.
		_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 5, Who: "a"}, insertStock("late", 1), guard.WithKey("batch-9"))
		require.ErrorIs(t, err, guard.ErrStaleToken)
		assert.EqualValues(t, 0, count(t, db.Pool, "SELECT count(*) FROM fencelock.applied WHERE key = 'batch-9'"))

		// A key with quotes and backslashes is stored verbatim (it travels as
		// a literal in the begin round trip).
		odd := `it's a \'key\' ; DROP TABLE stock; --`
		_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 6, Who: "b"}, insertStock("odd", 1), guard.WithKey(odd))
		require.NoError(t, err)
		assert.EqualValues(t, 1, count(t, db.Pool, "SELECT count(*) FROM fencelock.applied WHERE key = $1", odd))
		_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 6, Who: "b"}, insertStock("odd", 1), guard.WithKey(odd))
		require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	})
}

func TestRollbackOnErrorPanicAndCancel(t *testing.T) {
	onBothPaths(t, func(t *testing.T, db *testenv.DB, pool *pgxpool.Pool) {
		stockTable(t, db.Pool)
		s := newStore(t, pool)
		ctx := testCtx(t)
		boom := errors.New("boom")

		t.Run("error", func(t *testing.T) {
			_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "err", Tok: 3, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
				if err := insertStock("err", 2)(ctx, tx); err != nil {
					return err
				}
				return boom
			}, guard.WithKey("k"))
			require.ErrorIs(t, err, boom)
		})
		t.Run("panic", func(t *testing.T) {
			defer func() {
				assert.Equal(t, "kaboom", recover())
			}()
			_, _ = guard.Exec(ctx, s, guardtest.Lease{Resource: "panic", Tok: 3, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
				if err := insertStock("panic", 2)(ctx, tx); err != nil {
					return err
				}
				panic("kaboom")
			}, guard.WithKey("k"))
			t.Error("Exec returned instead of panicking")
		})
		t.Run("cancel", func(t *testing.T) {
			cctx, cancel := context.WithCancel(ctx)
			_, err := guard.Exec(cctx, s, guardtest.Lease{Resource: "cancel", Tok: 3, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
				if err := insertStock("cancel", 2)(ctx, tx); err != nil {
					return err
				}
				cancel()
				return insertStock("cancel", 1)(ctx, tx)
			}, guard.WithKey("k"))
			require.ErrorIs(t, err, context.Canceled)
		})
		t.Run("cancel after fn", func(t *testing.T) {
			cctx, cancel := context.WithCancel(ctx)
			_, err := guard.Exec(cctx, s, guardtest.Lease{Resource: "cancel2", Tok: 3, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
				err := insertStock("cancel2", 2)(ctx, tx)
				cancel()
				return err
			}, guard.WithKey("k"))
			require.ErrorIs(t, err, context.Canceled)
		})
		// Nothing of any of them: no rows, no key. (Their tokens were
		// recorded when they began, as Advance does.)
		assert.EqualValues(t, 0, count(t, db.Pool, "SELECT count(*) FROM stock"))
		assert.EqualValues(t, 0, count(t, db.Pool, "SELECT count(*) FROM fencelock.applied"))
		// And the pool still works.
		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "err", Tok: 3, Who: "a"}, insertStock("ok", 1), guard.WithKey("k"))
		require.NoError(t, err)
	})
}

func TestBadInput(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	fn := insertStock("bad", 1)

	for _, tc := range []struct {
		name  string
		lease guard.Lease
		opts  []guard.Option
		want  error
		msg   string
	}{
		{"nil lease", nil, nil, guard.ErrInvalidLease, "nil lease"},
		{"empty resource", guardtest.Lease{Resource: "", Tok: 1, Who: "a"}, nil, guard.ErrInvalidLease, "empty resource"},
		{"zero token", guardtest.Lease{Resource: "r", Tok: 0, Who: "a"}, nil, guard.ErrInvalidLease, "token must be > 0"},
		{"negative token", guardtest.Lease{Resource: "r", Tok: -5, Who: "a"}, nil, guard.ErrInvalidLease, "token must be > 0"},
		{"empty holder", guardtest.Lease{Resource: "r", Tok: 1, Who: ""}, nil, guard.ErrInvalidLease, "empty holder"},
		{"NUL in resource", guardtest.Lease{Resource: "r\x00", Tok: 1, Who: "a"}, nil, guard.ErrInvalidLease, "NUL"},
		{"invalid UTF-8 holder", guardtest.Lease{Resource: "r", Tok: 1, Who: "\xff"}, nil, guard.ErrInvalidInput, "UTF-8"},
		{"empty key", guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, []guard.Option{guard.WithKey("")}, guard.ErrInvalidOption, "empty idempotency key"},
		{"nil option", guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, []guard.Option{nil}, guard.ErrInvalidOption, "nil Option"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := guard.Exec(ctx, s, tc.lease, fn, tc.opts...)
			require.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, nil)
	require.ErrorIs(t, err, guard.ErrNilFunc)
	_, err = guard.Exec[pgx.Tx](ctx, nil, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, fn)
	require.ErrorIs(t, err, guard.ErrNilStore)

	// Advance and runs reject the same leases.
	require.ErrorIs(t, s.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 0, Who: "a"}), guard.ErrInvalidLease)
	require.ErrorIs(t, s.Advance(ctx, nil), guard.ErrInvalidLease)
	_, _, err = s.Run(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, "").Resume(ctx)
	require.ErrorIs(t, err, guard.ErrInvalidInput)
	require.ErrorIs(t, s.Run(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, "").Step(ctx, "1", nil), guard.ErrInvalidInput)
	require.ErrorIs(t, s.Run(guardtest.Lease{Resource: "", Tok: 1, Who: "a"}, "run").Finish(ctx), guard.ErrInvalidLease)
	require.ErrorIs(t, s.Run(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, "run").Step(ctx, "bad\x00cursor", nil), guard.ErrInvalidInput)
	_, err = s.Prune(ctx, -1)
	require.ErrorIs(t, err, guard.ErrInvalidInput)

	// Claims made by hand (guard.Store.Begin directly) are checked too.
	_, err = s.Begin(ctx, guard.Claim{Resource: "r", Token: 0, Holder: "a"})
	require.ErrorIs(t, err, guard.ErrInvalidLease)

	// Nothing was written by any of them.
	assert.EqualValues(t, 0, count(t, db.Pool, "SELECT count(*) FROM stock"))
	assert.EqualValues(t, 0, count(t, db.Pool, "SELECT count(*) FROM fencelock.fence"))
	assert.EqualValues(t, 0, count(t, db.Pool, "SELECT count(*) FROM fencelock.runs"))

	// New and its options.
	_, err = pgfence.New(nil)
	require.ErrorIs(t, err, guard.ErrNilDB)
	_, err = pgfence.New((*pgxpool.Pool)(nil))
	require.ErrorIs(t, err, guard.ErrNilDB)
	_, err = pgfence.New(db.Pool, pgstore.WithLockTimeout(0))
	require.ErrorIs(t, err, guard.ErrInvalidOption)
	_, err = pgfence.New(db.Pool, nil)
	require.ErrorIs(t, err, guard.ErrInvalidOption)
}

// Without the schema every call says so, naming the database and a fix
// that works as written: the URL in it migrates the database, and the
// same Store works from then on.
func TestMissingSchema(t *testing.T) {
	db := testenvNewDB(t) // no migrations
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	mustExec(t, db.Pool, "CREATE TABLE stock (sku text)")

	var fixURL string
	check := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, guard.ErrSchemaMissing, what)
		assert.NotErrorIs(t, err, guard.ErrSchemaOutdated, what)
		assert.Contains(t, err.Error(), `schema not installed in database "`+db.Name+`"`, what)
		assert.Contains(t, err.Error(), "run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db '", what)
		m := regexp.MustCompile(`--db '([^']+)'`).FindStringSubmatch(err.Error())
		require.Len(t, m, 2, err.Error())
		fixURL = m[1]
	}
	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(context.Context, pgx.Tx) error { return nil })
	check("Exec", err)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(context.Context, pgx.Tx) error { return nil }, guard.WithKey("k"))
	check("Exec WithKey", err)
	check("Advance", s.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}))
	check("Protect", s.Protect(ctx, "stock"))
	_, _, err = s.Run(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, "run").Resume(ctx)
	check("Resume", err)
	check("Step", s.Run(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, "run").Step(ctx, "1", nil))
	_, err = s.Prune(ctx, 0)
	check("Prune", err)
	// Connections went back clean.
	assert.EqualValues(t, 0, count(t, db.Pool, "SELECT count(*) FROM stock"))

	pool, err := pgxpool.New(ctx, fixURL)
	require.NoError(t, err, fixURL)
	defer pool.Close()
	migrate(t, pool)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(context.Context, pgx.Tx) error { return nil })
	require.NoError(t, err, "the same Store, once the schema is installed")
}

func TestAdvanceClosesTheWindowBeforeFirstWrite(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)

	a := guardtest.Lease{Resource: "r", Tok: 100, Who: "a"}
	b := guardtest.Lease{Resource: "r", Tok: 101, Who: "b"}
	require.NoError(t, s.Advance(ctx, a))
	// B acquires and advances, but has not written yet.
	require.NoError(t, s.Advance(ctx, b))
	assert.EqualValues(t, 101, storedToken(t, db.Pool, "r"))
	// A (paused until now) writes before B's first write: rejected.
	_, err := guard.Exec(ctx, s, a, insertStock("a", 3))
	var se *guard.StaleTokenError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, guard.StaleTokenError{Resource: "r", Token: 100, Current: 101}, *se)
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "a"))
	// A cannot advance back either; B's write goes through.
	require.ErrorIs(t, s.Advance(ctx, a), guard.ErrStaleToken)
	require.NoError(t, s.Advance(ctx, b), "the same holder may advance again")
	_, err = guard.Exec(ctx, s, b, insertStock("b", 2))
	require.NoError(t, err)
	assert.EqualValues(t, 2, rowsBy(t, db.Pool, "b"))
}

// A *pgx.Conn is a DB too, and a refused claim leaves it usable.
func TestStoreOverConn(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	s := newStore(t, conn)

	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}, insertStock("b", 1), guard.WithKey("k"))
	require.NoError(t, err)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insertStock("a", 1))
	require.ErrorIs(t, err, guard.ErrStaleToken)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}, insertStock("b", 1), guard.WithKey("k"))
	require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	assert.EqualValues(t, 'I', conn.PgConn().TxStatus())
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}, insertStock("b", 1))
	require.NoError(t, err)
	assert.EqualValues(t, 2, rowsBy(t, db.Pool, "b"))
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "a"))
}

// Any other DB implementation takes the two-round-trip path, with the same
// semantics.
func TestStoreOverOtherDB(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	s := newStore(t, wrappedDB{db.Pool})

	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}, insertStock("b", 1), guard.WithKey("k"))
	require.NoError(t, err)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insertStock("a", 1))
	require.ErrorIs(t, err, guard.ErrStaleToken)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 3, Who: "b"}, insertStock("b", 1), guard.WithKey("k"))
	require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	assert.EqualValues(t, 1, rowsBy(t, db.Pool, "b"))
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "a"))
	assert.EqualValues(t, 3, storedToken(t, db.Pool, "r"), "recorded at begin, as Advance does")
}

type wrappedDB struct{ *pgxpool.Pool }

func TestMapErrorOfRawSQL(t *testing.T) {
	db := newDB(t)
	ctx := testCtx(t)
	s := newStore(t, db.Pool)
	require.NoError(t, s.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 5, Who: "b"}))
	_, err := db.Pool.Exec(ctx, "SELECT fencelock.claim('r', 4, 'a')")
	require.Error(t, err)
	mapped := pgfence.MapError(err)
	var se *guard.StaleTokenError
	require.ErrorAs(t, mapped, &se)
	assert.Equal(t, guard.StaleTokenError{Resource: "r", Token: 4, Current: 5}, *se)
	assert.Nil(t, pgfence.MapError(nil))
	other := errors.New("x")
	assert.Equal(t, other, pgfence.MapError(other))
	assert.True(t, strings.HasPrefix(se.Error(), "guard: "))
}

// The precheck at begin passes, and a newer holder claims (or finishes
// the run, or applies the key) while fn runs: the claim in the commit
// round trip refuses, nothing is committed, and the connection is left
// idle and usable (a *pgx.Conn shows it directly).
func TestCommitTimeRefusal(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	s := newStore(t, conn)
	other := newStore(t, db.Pool)
	a, b := guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}

	meanwhile := func(f func() error) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			if err := insertStock("A", 1)(ctx, tx); err != nil {
				return err
			}
			return f()
		}
	}
	// A key applied by another transaction of the same holder.
	_, err = guard.Exec(ctx, s, a, meanwhile(func() error {
		_, err := guard.Exec(ctx, other, a, insertStock("B", 1), guard.WithKey("k"))
		return err
	}), guard.WithKey("k"))
	require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	assert.EqualValues(t, 'I', conn.PgConn().TxStatus())

	// A run finished by another transaction.
	err = s.Run(a, "run").Step(ctx, "1", meanwhile(func() error { return other.Run(a, "run").Finish(ctx) }))
	require.ErrorIs(t, err, guard.ErrRunFinished)
	assert.EqualValues(t, 'I', conn.PgConn().TxStatus())

	// A newer holder.
	_, err = guard.Exec(ctx, s, a, meanwhile(func() error { return other.Advance(ctx, b) }))
	var se *guard.StaleTokenError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, guard.StaleTokenError{Resource: "r", Token: 1, Current: 2}, *se)
	assert.EqualValues(t, 'I', conn.PgConn().TxStatus())

	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "A"), "nothing of any refused transaction")
	assert.EqualValues(t, 1, rowsBy(t, db.Pool, "B"))
	_, err = guard.Exec(ctx, s, b, insertStock("C", 1))
	require.NoError(t, err, "the connection is usable")
	assert.EqualValues(t, 1, rowsBy(t, db.Pool, "C"))
}

// fn's tx kept past Exec is closed, as pgx's own Tx is after Commit: it
// cannot run statements on a connection that went back to the pool, after
// a commit as after a commit-time refusal.
func TestTxClosedAfterExec(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	var kept pgx.Tx
	keep := func(ctx context.Context, tx pgx.Tx) error {
		kept = tx
		return insertStock("x", 1)(ctx, tx)
	}
	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, keep)
	require.NoError(t, err)
	_, err = kept.Exec(ctx, "INSERT INTO stock VALUES ('y', 1, 'leaked')")
	require.ErrorIs(t, err, pgx.ErrTxClosed)

	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
		if err := keep(ctx, tx); err != nil {
			return err
		}
		return s.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 2, Who: "b"})
	})
	require.ErrorIs(t, err, guard.ErrStaleToken)
	_, err = kept.Exec(ctx, "INSERT INTO stock VALUES ('y', 1, 'leaked')")
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	assert.EqualValues(t, 1, rowsBy(t, db.Pool, "x"))
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "leaked"))
}

// execEvents is an observer that keeps the guarded writes reported to
// it (up to its capacity).
type execEvents chan guard.ExecEvent

func (o execEvents) OnExec(_ context.Context, e guard.ExecEvent) {
	select {
	case o <- e:
	default:
	}
}

// The options that moved to package pgstore keep their pgfence names
// until v0.3.0, and they are the same options: set for the transaction,
// reported to, refused alike.
func TestDeprecatedOptions(t *testing.T) {
	db := newDB(t)
	ctx := testCtx(t)
	obs := make(execEvents, 4)
	s := newStore(t, db.Pool, pgfence.WithLockTimeout(250*time.Millisecond), pgfence.WithIdleTimeout(time.Minute), pgfence.WithObserver(obs))
	var lockTimeout, idle string
	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')").Scan(&lockTimeout, &idle)
	})
	require.NoError(t, err)
	assert.Equal(t, "250ms", lockTimeout)
	assert.Equal(t, "1min", idle)
	assert.Len(t, obs, 1, "the observer is the store's")

	for _, o := range []pgfence.Option{pgfence.WithLockTimeout(0), pgfence.WithIdleTimeout(0), pgfence.WithObserver(nil)} {
		_, err := pgfence.New(db.Pool, o)
		assert.ErrorIs(t, err, guard.ErrInvalidOption)
	}
}
