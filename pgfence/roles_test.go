package pgfence_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rolesNewRole creates a login role with the fencelock grants
// docs/operations.md gives (msgtest.AppGrants), less those whose index is
// in skip, plus its own table's privileges, and returns a pool connected
// as it. Roles are global to the server: the name is unique and the role
// is dropped at the end.
func rolesNewRole(t *testing.T, admin *pgxpool.Pool, url string, skip ...int) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := testCtx(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role := "fl_app_" + hex.EncodeToString(b)
	ident := pgx.Identifier{role}.Sanitize()
	mustExec(t, admin, "CREATE ROLE "+ident+" LOGIN NOSUPERUSER NOINHERIT")
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = admin.Exec(ctx, "DROP OWNED BY "+ident)
		_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+ident)
	})
	var owner string
	require.NoError(t, admin.QueryRow(ctx, "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'fencelock'").Scan(&owner))
	for i, g := range msgtest.AppGrants {
		if !slices.Contains(skip, i) {
			mustExec(t, admin, fmt.Sprintf(g, ident, owner))
		}
	}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var who string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_user").Scan(&who))
	require.Equal(t, role, who)
	return ident, pool
}

// A role with the documented grants less one (USAGE on the schema, or
// EXECUTE on its functions) is refused by guard.Exec, Advance and Prune
// with one message: the role, what it lacks, where, and the statements the
// schema's owner runs connected to that database; run as printed (as the
// owner it names, in the database it names), they fix the role, and the
// calls then succeed.
func TestRoleWithoutAGrant(t *testing.T) {
	for _, tc := range []struct {
		name  string
		skip  int
		lacks string
	}{
		{"no USAGE", 0, "USAGE on schema fencelock"},
		{"no EXECUTE", 1, "EXECUTE on function fencelock."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newDB(t)
			ctx := testCtx(t)
			role, appPool := rolesNewRole(t, db.Pool, db.URL, tc.skip)
			app := newStore(t, appPool)
			var owner, dbname string
			require.NoError(t, db.Pool.QueryRow(ctx, "SELECT current_user, current_database()").Scan(&owner, &dbname))
			a := guardtest.Lease{Resource: "perm", Tok: 7, Who: "a"}
			noop := func(context.Context, pgx.Tx) error { return nil }
			_, execErr := guard.Exec(ctx, app, a, noop)
			advErr := app.Advance(ctx, a)
			_, pruneErr := app.Prune(ctx, 0)
			want := fmt.Sprintf("pgfence: role %q lacks %s", strings.Trim(role, `"`), tc.lacks)
			for what, err := range map[string]error{"Exec": execErr, "Advance": advErr, "Prune": pruneErr} {
				msgtest.Check(t, what, err, guard.ErrPermission, "lacks")
				assert.Contains(t, err.Error(), want, what)
				assert.Contains(t, err.Error(), fmt.Sprintf(", so nothing was written: as the schema's owner (role %q), run in database %q: psql -U ", owner, dbname), what)
				assert.Equal(t, "42501", rolesCode(err), "%s: the server's error stays in the chain", what)
			}
			fix := msgtest.ParsePsql(t, execErr.Error())
			assert.Equal(t, owner, fix.User)
			assert.Equal(t, dbname, fix.Database)
			for _, stmt := range fix.SQL { // the owner's session, in that database
				mustExec(t, db.Pool, stmt)
			}
			_, err := guard.Exec(ctx, app, a, noop)
			require.NoError(t, err, "after the fix %s", fix)
			require.NoError(t, app.Advance(ctx, a))
			_, err = app.Prune(ctx, 0)
			require.NoError(t, err)
		})
	}
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
	role, appPool := rolesNewRole(t, db.Pool, db.URL)
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
