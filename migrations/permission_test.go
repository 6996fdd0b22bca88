package migrations_test

import (
	"crypto/rand"
	"encoding/hex"
	neturl "net/url"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loginRole creates a login role with no grant and returns its name and
// the URL of tdb as that role. The role is dropped at the end.
func loginRole(t *testing.T, tdb *testenv.DB, prefix string) (role, roleURL string) {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role = prefix + hex.EncodeToString(b)
	_, err := tdb.Pool.Exec(ctxT(t), "CREATE ROLE "+role+" LOGIN NOSUPERUSER NOINHERIT")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := ctxT(t)
		_, _ = tdb.Pool.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = tdb.Pool.Exec(ctx, "DROP ROLE IF EXISTS "+role)
	})
	u, err := neturl.Parse(tdb.URL)
	require.NoError(t, err)
	u.User = neturl.User(role)
	return role, u.String()
}

// Up, Down and Status refused a privilege (SQLSTATE 42501) say it as
// every fencelock call does (guard.ErrPermission): the role, what it
// lacks on which object, and the SQL that mends it, whom to run it as and
// in which database, or the one role that may migrate. Each fix, run as
// printed (as the role it names, in the database it names), lets the
// call that failed succeed.
func TestMigrationPermissionWorded(t *testing.T) {
	tdb := testenv.NewDB(t)
	ctx := ctxT(t)
	db := tdb.Name
	first, firstURL := loginRole(t, tdb, "fl_mig_")
	other, otherURL := loginRole(t, tdb, "fl_oth_")
	check := func(what string, err error, want string) msgtest.Psql {
		t.Helper()
		require.Error(t, err, what)
		assert.ErrorIs(t, err, guard.ErrPermission, what)
		assert.Equal(t, want, err.Error(), what)
		return msgtest.ParsePsql(t, err.Error())
	}

	// A database never migrated, a role that may create nothing in it:
	// the grants an admin runs there (both at once: the version table
	// goes in public, then the schema in the database).
	fix := check("Up as a role that may not create", migrations.Up(ctx, openDB(t, firstURL)),
		`migrations: up: role "`+first+`" lacks CREATE on schema public, so it cannot install or migrate schema fencelock: run migrations.Up as the role that is to own schema fencelock, or let this role create it:`+
			` as an admin (a superuser, or the database's owner), run in database "`+db+`": psql -d `+db+` -c 'GRANT CREATE ON DATABASE `+db+` TO `+first+`; GRANT CREATE ON SCHEMA public TO `+first+`;'`)
	fix.Run(t, tdb.URL)
	require.NoError(t, migrations.Up(ctx, openDB(t, firstURL)), "after %s", fix)

	// Another role: Status needs to read the version table (its owner
	// grants it); Down needs the schema's owner, which no grant mends.
	fix = check("Status as another role", statusErr(t, otherURL),
		`migrations: status: role "`+other+`" lacks SELECT on table fencelock_db_version, so it cannot read which migrations are applied:`+
			` as the table's owner (role "`+first+`"), run in database "`+db+`": psql -U `+first+` -d `+db+` -c 'GRANT SELECT ON fencelock_db_version TO `+other+`;'`)
	fix.Run(t, tdb.URL)
	require.NoError(t, statusErr(t, otherURL), "after %s", fix)
	err := migrations.Down(ctx, openDB(t, otherURL))
	require.Error(t, err)
	assert.ErrorIs(t, err, guard.ErrPermission)
	assert.Equal(t, `migrations: down: role "`+other+`" lacks ownership of schema fencelock, so it cannot drop schema fencelock: only its owner, role "`+first+`", may: run migrations.Down on a connection as that role`, err.Error())

	// The owner's Down leaves its version table, which refuses a third
	// role: only the owner can mend it, by dropping the table; then that
	// role needs the admin's grants to create the schema.
	require.NoError(t, migrations.Down(ctx, openDB(t, firstURL)))
	other, otherURL = loginRole(t, tdb, "fl_thi_")
	fix = check("Up after the owner's Down", migrations.Up(ctx, openDB(t, otherURL)),
		`migrations: up: role "`+other+`" lacks SELECT, INSERT, DELETE on table fencelock_db_version, so it cannot install or migrate schema fencelock:`+
			` only role "`+first+`", which owns fencelock_db_version (left by its Down, or by an Up that failed; with no schema fencelock it records nothing to keep), can mend this:`+
			` run migrations.Up as that role, or let this role migrate once that role has dropped the table: as that role (role "`+first+`"), run in database "`+db+`": psql -U `+first+` -d `+db+` -c 'DROP TABLE fencelock_db_version;'`)
	fix.Run(t, tdb.URL)
	fix = check("Up once the table is gone", migrations.Up(ctx, openDB(t, otherURL)),
		`migrations: up: role "`+other+`" lacks CREATE on schema public, so it cannot install or migrate schema fencelock: run migrations.Up as the role that is to own schema fencelock, or let this role create it:`+
			` as an admin (a superuser, or the database's owner), run in database "`+db+`": psql -d `+db+` -c 'GRANT CREATE ON DATABASE `+db+` TO `+other+`; GRANT CREATE ON SCHEMA public TO `+other+`;'`)
	fix.Run(t, tdb.URL)
	require.NoError(t, migrations.Up(ctx, openDB(t, otherURL)), "after %s", fix)
	_, err = migrations.Status(ctx, openDB(t, otherURL))
	require.NoError(t, err)
}

func statusErr(t *testing.T, url string) error {
	_, err := migrations.Status(ctxT(t), openDB(t, url))
	return err
}
