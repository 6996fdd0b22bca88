package sqlfence_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// appRole creates a login role with the grants docs/operations.md gives
// an application (msgtest.AppGrants) less those whose index is in skip,
// and returns its name and a database/sql handle connected as it.
func appRole(t *testing.T, url string, admin *sql.DB, skip ...int) (string, *sql.DB) {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "fl_sqlapp_" + hex.EncodeToString(b)
	role := pgx.Identifier{name}.Sanitize()
	mustExec(t, admin, "CREATE ROLE "+role+" LOGIN NOSUPERUSER NOINHERIT")
	t.Cleanup(func() {
		_, _ = admin.Exec("DROP OWNED BY " + role)
		_, _ = admin.Exec("DROP ROLE IF EXISTS " + role)
	})
	var owner string
	require.NoError(t, admin.QueryRow("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'fencelock'").Scan(&owner))
	for i, g := range msgtest.AppGrants {
		if !slices.Contains(skip, i) {
			mustExec(t, admin, fmt.Sprintf(g, role, owner))
		}
	}
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.User = name
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return name, db
}

// An application role with only the grants docs/operations.md lists (USAGE on
// the schema, EXECUTE on its functions) runs everything of sqlfence, and
// cannot touch the fence table itself.
func TestApplicationRole(t *testing.T) {
	tdb, admin := newDB(t)
	ctx := testCtx(t)
	role, db := appRole(t, tdb.URL, admin)
	mustExec(t, admin, "CREATE TABLE stock (sku text, writer text)")
	mustExec(t, admin, "GRANT INSERT, SELECT ON stock TO "+role)
	s := newStore(t, db)

	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insert("a"), guard.WithKey("k"))
	require.NoError(t, err)
	require.NoError(t, s.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}))
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insert("a"))
	require.ErrorIs(t, err, guard.ErrStaleToken)
	run := s.Run(guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}, "run")
	require.NoError(t, run.Step(ctx, "10", insert("b")))
	cursor, finished, err := run.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, "10", cursor)
	assert.False(t, finished)
	require.NoError(t, run.Finish(ctx))
	_, err = s.Prune(ctx, time.Hour)
	require.NoError(t, err)

	for _, q := range []string{
		"UPDATE fencelock.fence SET token = 1",
		"DELETE FROM fencelock.applied",
		"SELECT token FROM fencelock.fence FOR SHARE",
	} {
		_, err := db.ExecContext(ctx, q)
		require.Error(t, err, q)
		assert.Equal(t, "42501", pgcore.Code(err), "%s: insufficient_privilege", q)
	}
	assert.EqualValues(t, 2, count(t, admin, "SELECT token FROM fencelock.fence WHERE resource = 'r'"))
	assert.EqualValues(t, 2, count(t, admin, "SELECT count(*) FROM stock"))

}

// A role with the documented grants less one is refused by guard.Exec,
// Advance and Prune with pgfence's message (one mapping for every store):
// the role, what it lacks, the statements the schema's owner runs in the
// database named; run as printed, they fix the role.
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
			tdb, admin := newDB(t)
			ctx := testCtx(t)
			role, db := appRole(t, tdb.URL, admin, tc.skip)
			s := newStore(t, db)
			var owner, dbname string
			require.NoError(t, admin.QueryRow("SELECT current_user, current_database()").Scan(&owner, &dbname))
			a := guardtest.Lease{Resource: "perm", Tok: 7, Who: "a"}
			noop := func(context.Context, *sql.Tx) error { return nil }
			_, execErr := guard.Exec(ctx, s, a, noop)
			advErr := s.Advance(ctx, a)
			_, pruneErr := s.Prune(ctx, 0)
			for what, err := range map[string]error{"Exec": execErr, "Advance": advErr, "Prune": pruneErr} {
				msgtest.Check(t, what, err, guard.ErrPermission, "lacks")
				assert.Contains(t, err.Error(), fmt.Sprintf("sqlfence: role %q lacks %s", role, tc.lacks), what)
				assert.Contains(t, err.Error(), fmt.Sprintf(", so nothing was written: as the schema's owner (role %q), run in database %q: psql -U ", owner, dbname), what)
			}
			fix := msgtest.ParsePsql(t, execErr.Error())
			assert.Equal(t, owner, fix.User)
			assert.Equal(t, dbname, fix.Database)
			for _, stmt := range fix.SQL {
				mustExec(t, admin, stmt)
			}
			_, err := guard.Exec(ctx, s, a, noop)
			require.NoError(t, err, "after the fix %s", fix)
			require.NoError(t, s.Advance(ctx, a))
			_, err = s.Prune(ctx, 0)
			require.NoError(t, err)
		})
	}
}
