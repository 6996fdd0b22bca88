package sqlfence_test

import (
	"context"
	"database/sql"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serverView is the note of a fix whose URL is the server's view of the
// session: database/sql does not show sqlfence where it connects.
const serverView = "the address is the server's own, as Postgres sees it: use the URL you connect with if it differs"

// schemaFix is the message of sqlfence's first call on db, whose database
// has no fencelock schema, and the URL its fix names ("" for none).
func schemaFix(t *testing.T, db *sql.DB) (msg, fixURL string) {
	t.Helper()
	_, err := guard.Exec(testCtx(t), newStore(t, db), guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(context.Context, *sql.Tx) error { return nil })
	require.ErrorIs(t, err, guard.ErrSchemaMissing)
	msg = err.Error()
	t.Log(msg)
	assert.NotContains(t, msg, "$DATABASE_URL", "no environment variable the user may not have")
	if m := regexp.MustCompile(`fencectl migrate up --db '(postgres://[^']+)'`).FindStringSubmatch(msg); m != nil {
		fixURL = m[1]
	}
	return msg, fixURL
}

// pasted runs the fix's URL as a user would paste it, and checks that a
// Store on db then works.
func pasted(t *testing.T, db *sql.DB, fixURL string) {
	t.Helper()
	ctx := testCtx(t)
	require.NoError(t, migrations.Up(ctx, openDB(t, "pgx", fixURL)), "the fix: %s", fixURL)
	_, err := guard.Exec(ctx, newStore(t, db), guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(context.Context, *sql.Tx) error { return nil })
	require.NoError(t, err)
}

// Over TCP the fix's URL is the server's address as it sees the session,
// said to be so: directly, the one the Store dialled, and pasting it
// migrates the database; through PgBouncer, Postgres's own address, not
// the pooler's (a migration needs a session, which transaction pooling
// does not keep).
func TestSchemaFixOverTCP(t *testing.T) {
	tdb := testenv.NewDB(t)
	msg, fixURL := schemaFix(t, openDB(t, "pgx", tdb.URL))
	require.NotEmpty(t, fixURL, msg)
	u, err := url.Parse(fixURL)
	require.NoError(t, err)
	assert.Equal(t, tdb.Server.Addr, u.Host)
	assert.Equal(t, "/"+tdb.Name, u.Path)
	assert.True(t, strings.HasSuffix(msg, "'"+fixURL+"' (with the password in place of xxxxx; "+serverView+")"), msg)
	pasted(t, openDB(t, "pgx", tdb.URL), fixURL)

	bounced := testenv.NewDBViaPgBouncer(t)
	_, fixURL = schemaFix(t, openDB(t, "pgx", bounced.URL))
	u, err = url.Parse(fixURL)
	require.NoError(t, err)
	assert.Equal(t, bounced.Server.Addr, u.Host, "Postgres's address, not PgBouncer's")
	assert.NotContains(t, bounced.URL, u.Host)
}

// Over a Unix socket the fix's URL is the server's first socket directory
// and its port, for a role that may read unix_socket_directories (a
// superuser, a member of pg_read_all_settings), and pasting it migrates
// the database; for any other role a placeholder for the URL that names
// the database and the role.
func TestSchemaFixOverSocket(t *testing.T) {
	tdb := testenv.NewDB(t)
	require.NotEmpty(t, tdb.Server.SocketDir, "testenv's Postgres has a socket directory")
	_, port, _ := strings.Cut(tdb.Server.Addr, ":")
	socketURL := func(user string) string {
		return "postgres://" + user + "@/" + tdb.Name + "?" + url.Values{"host": {tdb.Server.SocketDir}, "port": {port}}.Encode()
	}
	ctx := testCtx(t)
	role := "fl_sock_" + strings.TrimPrefix(tdb.Name, "fence_")
	_, err := tdb.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN NOSUPERUSER`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = tdb.Pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+role) })
	msg, fixURL := schemaFix(t, openDB(t, "pgx", socketURL(role)))
	assert.Empty(t, fixURL, msg)
	assert.True(t, strings.HasSuffix(msg, `: run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db '<the URL of database "`+
		tdb.Name+`" as role "`+role+`">'`), msg)

	msg, fixURL = schemaFix(t, openDB(t, "pgx", socketURL("postgres")))
	require.NotEmpty(t, fixURL, msg)
	u, err := url.Parse(fixURL)
	require.NoError(t, err)
	assert.Equal(t, "", u.Host)
	assert.Equal(t, tdb.Server.SocketDir, u.Query().Get("host"))
	assert.Equal(t, port, u.Query().Get("port"))
	assert.True(t, strings.HasSuffix(msg, "'"+fixURL+"' (with the password in place of xxxxx; "+serverView+")"), msg)
	pasted(t, openDB(t, "pgx", socketURL("postgres")), fixURL)
}
