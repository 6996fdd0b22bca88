package migrations_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	neturl "net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// freshCatalog is the catalog of a database that Up installed from nothing.
func freshCatalog(t *testing.T) []string {
	t.Helper()
	db := openDB(t, testenv.NewDB(t).URL)
	require.NoError(t, migrations.Up(ctxT(t), db))
	return catalog(t, db)
}

// inUse puts a database into the state of one in use: a stored token 7 of
// holder a for resource r, an applied key and a run moved to cursor 5.
func inUse(t *testing.T, db *sql.DB) {
	t.Helper()
	tx := txRunner(t, db)
	require.NoError(t, tx(`SELECT fencelock.claim('r', 7, 'a', 'k1')`))
	require.NoError(t, tx(`SELECT fencelock.claim('r', 7, 'a')`, `SELECT fencelock.close('r', 7, 'a', NULL, 'run', '5')`))
}

// requireInUse checks that what inUse stored is still there.
func requireInUse(t *testing.T, db *sql.DB) {
	t.Helper()
	ctx := ctxT(t)
	var token int64
	var holder, cursor string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT token, holder FROM fencelock.fence WHERE resource = 'r'`).Scan(&token, &holder))
	assert.EqualValues(t, 7, token, "the stored token is kept")
	assert.Equal(t, "a", holder)
	require.NoError(t, db.QueryRowContext(ctx, `SELECT cursor FROM fencelock.runs WHERE resource = 'r' AND run_key = 'run'`).Scan(&cursor))
	assert.Equal(t, "5", cursor, "the run is kept")
	var keys int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM fencelock.applied WHERE resource = 'r' AND key = 'k1'`).Scan(&keys))
	assert.Equal(t, 1, keys, "the applied key is kept")
}

// A database migrated at 88937a5 (00001 and 00002 as released then, before
// they were edited in place), in use, with an application role granted
// what the docs said then (USAGE, EXECUTE on the functions of that time),
// is brought by Up to exactly what a fresh install is: its tokens, keys
// and runs kept; the fence lock in force (a new token waits for a commit
// that checks under the shared lock); the application role can run a
// guarded write through pgfence and read the fence tables.
func TestUpgradeFrom88937a5(t *testing.T) {
	want := freshCatalog(t)
	tdb := testenv.NewDB(t)
	db := openDB(t, tdb.URL)
	ctx := ctxT(t)
	_, err := gooseProvider(t, db, os.DirFS("testdata/88937a5")).Up(ctx)
	require.NoError(t, err)
	inUse(t, db)
	role, appURL := newAppRole(t, db, tdb.URL)
	_, err = db.ExecContext(ctx, `CREATE TABLE stock (sku text, writer text); GRANT INSERT ON stock TO `+role)
	require.NoError(t, err)

	require.NoError(t, migrations.Up(ctx, db))
	assert.Equal(t, allVersions(t), recorded(t, db))
	requireInUse(t, db)
	got := catalog(t, db)
	assert.Empty(t, catalogDiff(want, got), "the upgraded schema differs from a fresh install's")
	assert.Equal(t, want, got)

	requireFenceLock(t, tdb.Pool)

	pool, err := pgxpool.New(ctx, appURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgfence.New(pool)
	require.NoError(t, err)
	insert := func(writer string) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO stock VALUES ('x', $1)`, writer)
			return err
		}
	}
	_, err = guard.Exec(ctx, store, guardtest.Lease{Resource: "r", Tok: 8, Who: "b"}, insert("b"), guard.WithKey("k2"))
	require.NoError(t, err, "a guarded write as the application role")
	_, err = guard.Exec(ctx, store, guardtest.Lease{Resource: "r", Tok: 7, Who: "a"}, insert("a"))
	require.ErrorIs(t, err, guard.ErrStaleToken, "the old holder is refused")
	var token int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT token FROM fencelock.fence WHERE resource = 'r'`).Scan(&token), "the application role reads the fence table")
	assert.EqualValues(t, 8, token)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM fencelock.applied) + (SELECT count(*) FROM fencelock.runs)`).Scan(&n))
	assert.Equal(t, 3, n)
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM stock`).Scan(&n))
	assert.Equal(t, 1, n, "only the current holder's write")
}

// requireFenceLock checks that a new token is stored only under the
// resource's exclusive fence lock: while a transaction holds the shared
// one (as a commit that checks its token does), claim waits for it.
func requireFenceLock(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := ctxT(t)
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(hashtextextended('r', 1380730187))`)
	require.NoError(t, err)
	claimer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = claimer.Rollback(ctx) }()
	_, err = claimer.Exec(ctx, `SET LOCAL lock_timeout = '300ms'`)
	require.NoError(t, err)
	_, err = claimer.Exec(ctx, `SELECT fencelock.claim('r', 100, 'z')`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "claim of a new token did not wait for the shared fence lock: %v", err)
	assert.Equal(t, "55P03", pgErr.Code, "lock_not_available: %v", err)
}

// A database at version 3 as landed at be68919 (00001 to 00003 as they are
// now, pinned by TestReleasedMigrationsUnchanged), in use: 00004 changes
// nothing there but schema_version(), and Up brings it to exactly a fresh
// install's schema.
func TestUpgradeFromBe68919(t *testing.T) {
	want := freshCatalog(t)
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	p := gooseProvider(t, db, migrations.FS())
	_, err := p.UpTo(ctx, 3)
	require.NoError(t, err)
	inUse(t, db)
	before := catalog(t, db)

	_, err = p.UpTo(ctx, 4)
	require.NoError(t, err)
	var changed []string
	for _, d := range catalogDiff(before, catalog(t, db)) {
		if !strings.Contains(d, "function fencelock.schema_version()") {
			changed = append(changed, d)
		}
	}
	assert.Empty(t, changed, "00004 changes only schema_version() on a database whose 00001 to 00003 are the landed files")
	assert.Len(t, catalogDiff(before, catalog(t, db)), 2, "schema_version() is redefined")

	require.NoError(t, migrations.Up(ctx, db))
	assert.Equal(t, allVersions(t), recorded(t, db))
	requireInUse(t, db)
	got := catalog(t, db)
	assert.Empty(t, catalogDiff(want, got), "the upgraded schema differs from a fresh install's")
	assert.Equal(t, want, got)
}

// gooseProvider is a goose provider over fsys with fencelock's version
// table, as the goose CLI with -table uses it.
func gooseProvider(t *testing.T, db *sql.DB, fsys fs.FS) *goose.Provider {
	t.Helper()
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithTableName(migrations.VersionTable))
	require.NoError(t, err)
	return p
}

// newAppRole creates a login role with the grants docs/operations.md
// gives an application role (msgtest.AppGrants) less those whose index is
// in skip, on the fencelock schema as it is now, and returns its name,
// quoted, and the URL of the database as that role. The role is dropped
// at the end of the test.
func newAppRole(t *testing.T, db *sql.DB, dbURL string, skip ...int) (role, roleURL string) {
	t.Helper()
	ctx := ctxT(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "fl_app_" + hex.EncodeToString(b)
	role = pgx.Identifier{name}.Sanitize()
	_, err := db.ExecContext(ctx, "CREATE ROLE "+role+" LOGIN NOSUPERUSER NOINHERIT")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = db.ExecContext(ctx, "DROP OWNED BY "+role)
		_, _ = db.ExecContext(ctx, "DROP ROLE IF EXISTS "+role)
	})
	var owner string
	require.NoError(t, db.QueryRowContext(ctx, "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'fencelock'").Scan(&owner))
	for i, g := range msgtest.AppGrants {
		if !slices.Contains(skip, i) {
			_, err := db.ExecContext(ctx, fmt.Sprintf(g, role, owner))
			require.NoError(t, err)
		}
	}
	u, err := neturl.Parse(dbURL)
	require.NoError(t, err)
	u.User = neturl.User(name)
	return role, u.String()
}

// Against a schema older than they need (migrated at 88937a5, then to
// each version before the last), pgfence and sqlfence refuse every guarded call before they
// send anything that could store a token, with one error naming the
// versions and a fix whose URL migrates the database (the owner's, for a
// Store that connects as an application role); once Up has run, the same
// Stores work.
func TestStoresRefuseOldSchema(t *testing.T) {
	tdb := testenv.NewDB(t)
	db := openDB(t, tdb.URL)
	ctx := ctxT(t)
	_, err := gooseProvider(t, db, os.DirFS("testdata/88937a5")).Up(ctx)
	require.NoError(t, err)
	inUse(t, db)
	_, appURL := newAppRole(t, db, tdb.URL)

	pg, err := pgfence.New(tdb.Pool)
	require.NoError(t, err)
	sqlDB := openDB(t, tdb.URL)
	sq, err := sqlfence.New(sqlDB)
	require.NoError(t, err)
	appPool, err := pgxpool.New(ctx, appURL)
	require.NoError(t, err)
	t.Cleanup(appPool.Close)
	app, err := pgfence.New(appPool)
	require.NoError(t, err)

	var ran bool
	calls := map[string]func() error{
		"pgfence Exec": func() error {
			_, err := guard.Exec(ctx, pg, guardtest.Lease{Resource: "r", Tok: 8, Who: "b"}, func(context.Context, pgx.Tx) error { ran = true; return nil })
			return err
		},
		"pgfence Advance": func() error { return pg.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 8, Who: "b"}) },
		"sqlfence Exec": func() error {
			_, err := guard.Exec(ctx, sq, guardtest.Lease{Resource: "r", Tok: 8, Who: "b"}, func(context.Context, *sql.Tx) error { ran = true; return nil })
			return err
		},
		"sqlfence Advance": func() error { return sq.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 8, Who: "b"}) },
		"pgfence Exec as the application role": func() error {
			_, err := guard.Exec(ctx, app, guardtest.Lease{Resource: "r", Tok: 8, Who: "b"}, func(context.Context, pgx.Tx) error { ran = true; return nil })
			return err
		},
	}
	fixURLs := map[string]string{}
	refused := func(have string) {
		t.Helper()
		for name, call := range calls {
			err := call()
			require.ErrorIs(t, err, guard.ErrSchemaOutdated, name)
			require.ErrorIs(t, err, guard.ErrSchemaMissing, name)
			msg := err.Error()
			t.Logf("%s: %s", name, msg)
			assert.NotContains(t, msg, "\n", name)
			assert.Equal(t, 1, strings.Count(msg, "out of date"), msg)
			assert.Contains(t, msg, `guard: fencelock schema out of date: schema fencelock in database "`+tdb.Name+`" is at `+have+` and this fencelock needs `+strconv.Itoa(pgcore.SchemaVersion)+`: `, name)
			m := regexp.MustCompile(`, or: fencectl migrate up --db '([^']+)'( \(with the (owner's )?password in place of xxxxx(; the address is the server's own, as Postgres sees it: use the URL you connect with if it differs)?\))?$`).FindStringSubmatch(msg)
			require.NotNil(t, m, msg)
			u, err := neturl.Parse(m[1])
			require.NoError(t, err)
			if strings.HasSuffix(name, "application role") {
				assert.Contains(t, msg, `only the schema's owner, role "postgres", may migrate it`, name)
				assert.Contains(t, msg, `run migrations.Up(ctx, db) on a connection as the owner`, name)
				assert.Equal(t, 1, strings.Count(msg, `"postgres"`), "the owner is named once: %s", msg)
				assert.Equal(t, "postgres", u.User.Username(), "the owner migrates")
				assert.Contains(t, msg, `(with the owner's password in place of xxxxx)`)
			} else {
				assert.Contains(t, msg, ": run migrations.Up(ctx, db) at start-up, or: ", name)
			}
			fixURLs[name] = m[1]
		}
		assert.False(t, ran, "fn ran")
		requireInUse(t, db) // nothing stored the new token
	}
	refused("a version older than 3 (it has no fencelock.schema_version())")
	for v := int64(3); v < lastVersion(t); v++ {
		_, err = gooseProvider(t, db, migrations.FS()).UpTo(ctx, v)
		require.NoError(t, err)
		refused("version " + strconv.FormatInt(v, 10))
	}

	// The fix as written (a password masked as xxxxx works: the test
	// server trusts its loopback clients).
	for name, u := range fixURLs {
		require.NoError(t, migrations.Up(ctx, openDB(t, u)), "%s: %s", name, u)
	}
	for name, call := range calls {
		require.NoError(t, call(), "%s, after Up", name)
	}
	assert.True(t, ran)
}

// An application role made with the grants the docs give, before a
// migration that adds functions (00005 adds outbox_backlog and
// outbox_revive), may execute them after the owner migrates: the default
// privileges cover the functions the owner creates later. A role made
// without that line (the grants of the docs before it) is refused them:
// the control.
func TestAppRoleAcrossUpgrade(t *testing.T) {
	// The grants the roles get are the ones the docs give, line for line.
	doc, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)\n## Grants\n.*?```sql\n(.*?)```").FindSubmatch(doc)
	require.NotNil(t, m, "docs/operations.md has no sql block under '## Grants'")
	var want []string
	for _, g := range msgtest.AppGrants {
		want = append(want, fmt.Sprintf(g, "app", "owner")+";")
	}
	require.Equal(t, want, strings.Split(strings.TrimSpace(string(m[1])), "\n"), "msgtest.AppGrants are what docs/operations.md gives")

	tdb := testenv.NewDB(t)
	owner := openDB(t, tdb.URL)
	ctx := ctxT(t)
	_, err = gooseProvider(t, owner, migrations.FS()).UpTo(ctx, 4)
	require.NoError(t, err)
	_, docsURL := newAppRole(t, owner, tdb.URL)
	_, oldURL := newAppRole(t, owner, tdb.URL, 2)
	require.NoError(t, migrations.Up(ctx, owner))
	for _, fn := range []string{"fencelock.outbox_backlog(integer)", "fencelock.outbox_revive(bigint[], bigint)"} {
		var can bool
		require.NoError(t, openDB(t, docsURL).QueryRowContext(ctx, "SELECT has_function_privilege($1, 'EXECUTE')", fn).Scan(&can))
		assert.True(t, can, "the documented role may execute %s, added after it was made", fn)
		require.NoError(t, openDB(t, oldURL).QueryRowContext(ctx, "SELECT has_function_privilege($1, 'EXECUTE')", fn).Scan(&can))
		assert.False(t, can, "without default privileges, %s is not granted", fn)
	}
	var n int64
	require.NoError(t, openDB(t, docsURL).QueryRowContext(ctx, "SELECT count(*) FROM fencelock.outbox_backlog(1)").Scan(&n))
	_, err = openDB(t, oldURL).ExecContext(ctx, "SELECT fencelock.outbox_backlog(1)")
	assert.Equal(t, "42501", pgcore.Code(err), "%v", err)
}
