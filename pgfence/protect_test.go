package pgfence_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rawTx runs stmts in one raw transaction (as a writer in another
// language would) and returns the first error.
func rawTx(ctx context.Context, conn interface {
	Begin(context.Context) (pgx.Tx, error)
}, stmts ...string) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func TestProtect(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	mustExec(t, db.Pool, "INSERT INTO stock VALUES ('seed', 1, 'seed')")

	require.NoError(t, s.Protect(ctx, "stock"))
	require.NoError(t, s.Protect(ctx, "public.stock"), "protecting twice is harmless")
	require.NoError(t, s.Advance(ctx, guardtest.Lease{Resource: "stock", Tok: 10, Who: "b"}))

	t.Run("no claim", func(t *testing.T) {
		for _, stmt := range []string{
			"INSERT INTO stock VALUES ('x', 1, 'raw')",
			"UPDATE stock SET qty = 2",
			"DELETE FROM stock",
			"TRUNCATE stock",
		} {
			err := rawTx(ctx, db.Pool, stmt)
			require.Error(t, err, stmt)
			assert.Equal(t, "FL002", sqlState(err), stmt)
			require.ErrorIs(t, pgfence.MapError(err), guard.ErrNotClaimed, stmt)
		}
	})
	t.Run("stale claim", func(t *testing.T) {
		// The claim function itself refuses a stale token...
		err := rawTx(ctx, db.Pool, "SELECT fencelock.claim('stock', 9, 'a')", "INSERT INTO stock VALUES ('x', 1, 'raw')")
		assert.Equal(t, "FL001", sqlState(err))
		// ...and the trigger refuses a transaction whose claim settings
		// carry a stale token (set by hand, without the claim).
		err = rawTx(ctx, db.Pool,
			"SELECT set_config('fencelock.resource', 'stock', true), set_config('fencelock.token', '9', true), set_config('fencelock.holder', 'a', true)",
			"INSERT INTO stock VALUES ('x', 1, 'raw')")
		assert.Equal(t, "FL001", sqlState(err))
		var se *guard.StaleTokenError
		require.ErrorAs(t, pgfence.MapError(err), &se)
		assert.Equal(t, guard.StaleTokenError{Resource: "stock", Token: 9, Current: 10}, *se)
		// A writer that only ran the non-locking precheck (as guard.Exec
		// does at begin) with a stale token is refused by the precheck,
		// and by the trigger had it skipped the precheck's error.
		err = rawTx(ctx, db.Pool, "SELECT fencelock.precheck('stock', 9, 'a')", "INSERT INTO stock VALUES ('x', 1, 'raw')")
		assert.Equal(t, "FL001", sqlState(err))
	})
	t.Run("claim ended with its transaction", func(t *testing.T) {
		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		require.NoError(t, rawTx(ctx, conn, "SELECT fencelock.claim('stock', 10, 'b')"))
		// Same session, next transaction: the settings are gone.
		err = rawTx(ctx, conn, "INSERT INTO stock VALUES ('x', 1, 'raw')")
		assert.Equal(t, "FL002", sqlState(err))
	})
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "raw"))
	assert.EqualValues(t, 1, rowsBy(t, db.Pool, "seed"))

	t.Run("current claim", func(t *testing.T) {
		require.NoError(t, rawTx(ctx, db.Pool, "SELECT fencelock.claim('stock', 10, 'b')", "INSERT INTO stock VALUES ('x', 1, 'raw')"))
		require.NoError(t, rawTx(ctx, db.Pool, "SELECT fencelock.claim('stock', 11, 'c')", "UPDATE stock SET qty = qty + 1 WHERE writer = 'raw'"))
		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "stock", Tok: 11, Who: "c"}, insertStock("guarded", 2))
		require.NoError(t, err)
		assert.EqualValues(t, 1, rowsBy(t, db.Pool, "raw"))
		assert.EqualValues(t, 2, rowsBy(t, db.Pool, "guarded"))
		// The holder that was current a moment ago is now stale.
		err = rawTx(ctx, db.Pool, "SELECT fencelock.claim('stock', 10, 'b')", "INSERT INTO stock VALUES ('x', 1, 'raw')")
		assert.Equal(t, "FL001", sqlState(err))
	})

	require.NoError(t, s.Unprotect(ctx, "stock"))
	require.NoError(t, s.Unprotect(ctx, "stock"), "unprotecting twice is harmless")
	require.NoError(t, rawTx(ctx, db.Pool, "INSERT INTO stock VALUES ('x', 1, 'after')"))
	assert.EqualValues(t, 1, rowsBy(t, db.Pool, "after"))
}

func TestProtectForResource(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	require.NoError(t, s.Protect(ctx, "stock", pgfence.ForResource("stock-sync:eu")))

	// A current claim on another resource is not enough.
	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "other", Tok: 1, Who: "a"}, insertStock("other", 1))
	require.ErrorIs(t, err, guard.ErrNotClaimed, "guard.Exec maps fn's errors through the store")
	assert.Contains(t, err.Error(), `protected by resource "stock-sync:eu"`)
	// The bound resource is.
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "stock-sync:eu", Tok: 1, Who: "a"}, insertStock("eu", 1))
	require.NoError(t, err)
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "other"))
	assert.EqualValues(t, 1, rowsBy(t, db.Pool, "eu"))

	// Rebinding replaces the trigger; a resource name with quotes is a
	// literal, not SQL.
	odd := `it's "odd"\`
	require.NoError(t, s.Protect(ctx, "stock", pgfence.ForResource(odd)))
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: odd, Tok: 1, Who: "a"}, insertStock("odd", 1))
	require.NoError(t, err)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "stock-sync:eu", Tok: 1, Who: "a"}, insertStock("eu", 1))
	require.ErrorIs(t, err, guard.ErrNotClaimed)
	assert.EqualValues(t, 1, count(t, db.Pool, "SELECT count(*) FROM pg_trigger WHERE tgname = 'fencelock_protect'"))

	require.ErrorIs(t, s.Protect(ctx, "stock", pgfence.ForResource("")), guard.ErrInvalidOption)
	require.ErrorIs(t, s.Protect(ctx, "stock", nil), guard.ErrInvalidOption)
}

func TestProtectTableNames(t *testing.T) {
	db := newDB(t)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	mustExec(t, db.Pool, `CREATE SCHEMA inv`)
	mustExec(t, db.Pool, `CREATE TABLE inv."Stock_2$" (n int)`)

	require.NoError(t, s.Protect(ctx, `inv.Stock_2$`), "mixed case and $ are matched exactly")
	err := rawTx(ctx, db.Pool, `INSERT INTO inv."Stock_2$" VALUES (1)`)
	assert.Equal(t, "FL002", sqlState(err))
	require.NoError(t, s.Unprotect(ctx, `inv.Stock_2$`))

	for _, bad := range []string{
		"", ".", "a.", ".a", "a.b.c", "stock; DROP TABLE x", `"stock"`, "sto ck", "1stock",
		"stock--", "st'ock", "stock\x00", "ströck", "a.b c", string(make([]byte, 64)),
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", // 64 bytes
	} {
		err := s.Protect(ctx, bad)
		require.ErrorIs(t, err, pgfence.ErrBadTable, "%q", bad)
		require.ErrorIs(t, s.Unprotect(ctx, bad), pgfence.ErrBadTable, "%q", bad)
	}
	err = s.Protect(ctx, "missing")
	require.ErrorIs(t, err, pgfence.ErrNoTable)
	require.ErrorIs(t, s.Protect(ctx, "nosuchschema.stock"), pgfence.ErrNoTable)
	require.NoError(t, s.Unprotect(ctx, "missing"), "nothing to remove")
	// No trigger was created anywhere.
	assert.EqualValues(t, 0, count(t, db.Pool, "SELECT count(*) FROM pg_trigger WHERE tgname = 'fencelock_protect'"))
}

// guard.Exec only checks the token at begin and claims at commit; on a
// protected table the trigger claims at the first write instead, so a
// first holder of a new resource writes, a writer that only ran precheck
// has its token recorded (and a lower token is refused after it), and two
// transactions of one holder write and commit side by side without
// deadlocking on the fence row.
func TestProtectWithCommitTimeClaim(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	require.NoError(t, s.Protect(ctx, "stock"))

	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "new", Tok: 3, Who: "a"}, insertStock("first", 1))
	require.NoError(t, err, "first write ever for the resource")
	assert.EqualValues(t, 3, storedToken(t, db.Pool, "new"))

	require.NoError(t, rawTx(ctx, db.Pool, "SELECT fencelock.precheck('new', 5, 'b')", "INSERT INTO stock VALUES ('x', 1, 'precheck-only')"))
	assert.EqualValues(t, 5, storedToken(t, db.Pool, "new"), "the trigger recorded the token")
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "new", Tok: 4, Who: "c"}, insertStock("late", 1))
	require.ErrorIs(t, err, guard.ErrStaleToken)
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "late"))

	// One holder, two transactions at once, both past their first write
	// before either commits: the fence row is share-locked by both, and
	// both commits re-claim under a share lock (no upgrade, no deadlock).
	l := guardtest.Lease{Resource: "new", Tok: 6, Who: "d"}
	require.NoError(t, s.Advance(ctx, l))
	both := make(chan struct{}, 2)
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "INSERT INTO stock VALUES ($1, 1, 'par')", string(rune('a'+i))); err != nil {
					return err
				}
				both <- struct{}{}
				for len(both) < 2 && ctx.Err() == nil {
					runtime.Gosched()
				}
				return ctx.Err()
			})
			errs <- err
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	assert.EqualValues(t, 2, rowsBy(t, db.Pool, "par"))
}

// Unprotected tables: two transactions of one holder that reach their
// commit together both commit (the commit-time claims take turns on the
// fence row).
func TestSameHolderConcurrentCommits(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	l := guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}
	var ready sync.WaitGroup
	ready.Add(4)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
				err := insertStock("par", 1)(ctx, tx)
				ready.Done()
				ready.Wait()
				return err
			})
			errs <- err
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	assert.EqualValues(t, 4, rowsBy(t, db.Pool, "par"))
	assert.EqualValues(t, 1, storedToken(t, db.Pool, "r"))
}
