package pgfence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rolesNewRole creates a login role with the fencelock grants
// docs/operations.md gives (msgtest.AppGrants), less those whose index is
// in skip, and returns its name and a pool connected as it.
func rolesNewRole(t *testing.T, db *testenv.DB, skip ...int) (string, *pgxpool.Pool) {
	t.Helper()
	role, roleURL := msgtest.NewAppRole(t, db, skip...)
	pool, err := pgxpool.New(testCtx(t), roleURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return role, pool
}

// A role with the documented grants less one (USAGE on the schema, or
// EXECUTE on its functions) is refused by guard.Exec, Advance and Prune
// with one message naming the grant and who runs it where; run as
// printed, it fixes the role (msgtest.WalkMissingGrants).
func TestRoleWithoutAGrant(t *testing.T) {
	db := newDB(t)
	msgtest.WalkMissingGrants[pgx.Tx, pgfence.Run](t, db, "pgfence", func(t *testing.T, roleURL string) *pgfence.Store {
		pool, err := pgxpool.New(testCtx(t), roleURL)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return newStore(t, pool)
	})
}

func rolesCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// An application role with only USAGE on the schema and EXECUTE on its
// functions runs everything pgfence does: Advance, guard.Exec with a key,
// a resumable run, Prune, writes to a Protect-ed table (through guard and
// as raw SQL). It cannot touch the fencelock tables directly: lowering a
// token by hand is permission denied.
func TestRestrictedRole(t *testing.T) {
	db := newDB(t)
	ctx := testCtx(t)
	stockTable(t, db.Pool)
	// The table's owner (here the admin) protects it; the app may write it.
	admin := newStore(t, db.Pool)
	require.NoError(t, admin.Protect(ctx, "stock", pgfence.ForResource("sync")))
	role, appPool := rolesNewRole(t, db)
	mustExec(t, db.Pool, "GRANT SELECT, INSERT, UPDATE, DELETE ON stock TO "+role)
	app := newStore(t, appPool)

	a := guardtest.Lease{Resource: "sync", Tok: 10, Who: "a"}
	require.NoError(t, app.Advance(ctx, a))
	assert.EqualValues(t, 10, storedToken(t, db.Pool, "sync"))

	insert := func(writer string) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO stock (sku, qty, writer) VALUES ('x', 1, $1)", writer)
			return err
		}
	}
	_, err := guard.Exec(ctx, app, a, insert("exec"), guard.WithKey("batch-1"))
	require.NoError(t, err)
	_, err = guard.Exec(ctx, app, a, insert("exec-again"), guard.WithKey("batch-1"))
	require.ErrorIs(t, err, guard.ErrAlreadyApplied)

	run := app.Run(a, "run-1")
	cur, fin, err := run.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, "", cur)
	assert.False(t, fin)
	require.NoError(t, run.Step(ctx, "page-1", insert("run")))
	cur, _, err = run.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, "page-1", cur)
	require.NoError(t, run.Finish(ctx))
	_, fin, err = run.Resume(ctx)
	require.NoError(t, err)
	assert.True(t, fin)
	require.ErrorIs(t, run.Step(ctx, "page-2", insert("run")), guard.ErrRunFinished)

	// Raw SQL through the app role: claim first, then write.
	rawTx := func(stmts ...string) error {
		tx, err := appPool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		return tx.Commit(ctx)
	}
	require.NoError(t, rawTx("SELECT fencelock.claim('sync', 10, 'a')", "INSERT INTO stock VALUES ('x', 1, 'raw')"))
	err = rawTx("INSERT INTO stock VALUES ('x', 1, 'unclaimed')")
	require.ErrorIs(t, pgfence.MapError(err), guard.ErrNotClaimed)

	// A newer holder through the same role; the old one is refused.
	b := guardtest.Lease{Resource: "sync", Tok: 11, Who: "b"}
	require.NoError(t, app.Advance(ctx, b))
	_, err = guard.Exec(ctx, app, a, insert("stale"))
	require.ErrorIs(t, err, guard.ErrStaleToken)
	err = rawTx("SELECT fencelock.claim('sync', 10, 'a')", "INSERT INTO stock VALUES ('x', 1, 'stale-raw')")
	require.ErrorIs(t, pgfence.MapError(err), guard.ErrStaleToken)

	n, err := app.Prune(ctx, 0)
	require.NoError(t, err)
	assert.EqualValues(t, 2, n, "the key and the finished run")

	rows, err := db.Pool.Query(ctx, "SELECT writer FROM stock ORDER BY writer")
	require.NoError(t, err)
	writers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"exec", "raw", "run"}, writers)

	// The tables themselves are out of reach for writes: no lowering a
	// token by hand, no writing the bookkeeping. They may be read (pgfence
	// checks a token with a plain SELECT; see the migrations), which
	// changes nothing.
	for _, q := range []string{
		"UPDATE fencelock.fence SET token = 1 WHERE resource = 'sync'",
		"DELETE FROM fencelock.fence",
		"INSERT INTO fencelock.applied (resource, key, token) VALUES ('sync', 'k', 1)",
		"UPDATE fencelock.runs SET finished = false, finished_at = NULL",
		"SELECT token FROM fencelock.fence FOR SHARE", // a row lock is a write privilege
		"SELECT fencelock.apply_key('sync', 'k', 11)", // a helper: runs with the caller's rights
		"SELECT fencelock.close_full('sync', 1, 'h', NULL, NULL, NULL, false)",
	} {
		_, err := appPool.Exec(ctx, q)
		assert.Equal(t, "42501", rolesCode(err), "%s: want permission denied, got %v", q, err)
	}
	var tok int64
	require.NoError(t, appPool.QueryRow(ctx, "SELECT token FROM fencelock.fence WHERE resource = 'sync'").Scan(&tok))
	assert.EqualValues(t, 11, tok, "the application role reads the token")
	assert.EqualValues(t, 11, storedToken(t, db.Pool, "sync"))

	// A table the role owns: it protects it itself with the same grants
	// (creating the trigger needs EXECUTE on protect_guard), and unprotects.
	mustExec(t, db.Pool, "CREATE SCHEMA own AUTHORIZATION "+role)
	_, err = appPool.Exec(ctx, "CREATE TABLE own.t (v int)")
	require.NoError(t, err)
	require.NoError(t, app.Protect(ctx, "own.t"))
	_, err = appPool.Exec(ctx, "INSERT INTO own.t VALUES (1)")
	require.ErrorIs(t, pgfence.MapError(err), guard.ErrNotClaimed)
	require.NoError(t, app.Unprotect(ctx, "own.t"))

	// Without the EXECUTE grant the functions are closed too (they are not
	// executable by PUBLIC), Protect included.
	mustExec(t, db.Pool, "REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock FROM "+role)
	_, err = appPool.Exec(ctx, "SELECT fencelock.claim('sync', 12, 'c')")
	assert.Equal(t, "42501", rolesCode(err), "%v", err)
	err = app.Protect(ctx, "own.t")
	assert.Equal(t, "42501", rolesCode(err), "%v", err)
}
