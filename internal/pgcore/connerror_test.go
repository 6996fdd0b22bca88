package pgcore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/oneline"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// connect is pgx's error for a connection to url, which must fail.
func connect(t *testing.T, url string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err == nil {
		_ = c.Close(ctx)
		t.Fatalf("%s: connected", url)
	}
	return err
}

// checkConn checks ConnError's message for err: one line, prefix and the
// server's answer first, the answer once, where it came from, the fix at
// the end, and the server's error still there.
func checkConn(t *testing.T, err error, answer, code, where, fix string) {
	t.Helper()
	got := pgcore.ConnError("store", "op", err)
	msg := got.Error()
	t.Log(msg)
	assert.NotContains(t, msg, "\n")
	assert.True(t, strings.HasPrefix(msg, "store: op: "+answer+" (SQLSTATE "+code+"), from "+where+": "), msg)
	assert.Equal(t, 1, strings.Count(msg, answer), msg)
	assert.True(t, strings.HasSuffix(msg, ": "+fix), msg)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, got, &pgErr)
	assert.Equal(t, code, pgErr.Code)
	var ce *pgconn.ConnectError
	require.ErrorAs(t, got, &ce)
	assert.Same(t, got, pgcore.ConnError("other", "op", got), "a rewritten error is not rewritten again")
}

// The server's other refusals at connect: a role that does not exist, one
// that may not log in, a database over its connection limit; each names
// the role or database in its fix.
func TestConnErrorNamesTheFix(t *testing.T) {
	db := testenv.NewDB(t)
	ctx := context.Background()
	addr := db.Server.Addr
	url := func(user string) string {
		return "postgres://" + user + "@" + addr + "/" + db.Name + "?sslmode=prefer"
	}
	where := func(user string) string {
		return fmt.Sprintf("Postgres at %s as user %q, database %q", addr, user, db.Name)
	}

	// pg_hba.conf trusts roles outside testenv.PasswordGroup: the server
	// says the role is missing, not that its password is wrong.
	checkConn(t, connect(t, url("nosuchrole")), `role "nosuchrole" does not exist`, "28000", where("nosuchrole"),
		`check the user in the connection URL (or PGUSER), or create the role (CREATE ROLE "nosuchrole" LOGIN)`)

	noLogin := "nologin_" + strings.TrimPrefix(db.Name, "fence_")
	_, err := db.Pool.Exec(ctx, `CREATE ROLE `+noLogin+` NOLOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+noLogin) })
	checkConn(t, connect(t, url(noLogin)), `role "`+noLogin+`" is not permitted to log in`, "28000", where(noLogin),
		`let the role log in (ALTER ROLE "`+noLogin+`" LOGIN), or connect as another user`)

	user, _ := db.NewPasswordUser(t, "pw")
	_, err = db.Pool.Exec(ctx, `ALTER DATABASE `+db.Name+` CONNECTION LIMIT 0`)
	require.NoError(t, err)
	pwURL := "postgres://" + user + ":pw@" + addr + "/" + db.Name + "?sslmode=prefer"
	checkConn(t, connect(t, pwURL), `too many connections for database "`+db.Name+`"`, "53300", where(user),
		`use fewer connections to this database (a smaller pool), or lift its limit: ALTER DATABASE "`+db.Name+`" CONNECTION LIMIT -1`)
}

// A server shutting down (smart shutdown: it waits for its open sessions
// and refuses new ones) answers 57P03: the message says to retry.
func TestConnErrorServerShuttingDown(t *testing.T) {
	pg, err := testenv.StartPostgres()
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	held, err := pgx.Connect(ctx, pg.URL("postgres"))
	require.NoError(t, err)
	defer held.Close(ctx)
	require.NoError(t, syscall.Kill(pg.PID(), syscall.SIGTERM))

	var refused error
	for refused == nil && ctx.Err() == nil {
		c, err := pgx.Connect(ctx, pg.URL("postgres"))
		if err == nil {
			_ = c.Close(ctx)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		refused = err
	}
	checkConn(t, refused, "the database system is shutting down", "57P03",
		fmt.Sprintf("Postgres at %s as user %q, database %q", pg.Addr, "postgres", "postgres"),
		"retry once the server accepts connections again, or connect to one that does")
}

// A Unix socket where nothing listens (a directory without the server's
// socket): the message names the socket's path and the user and database,
// the dial's error, and a fix about the socket's directory and a server on
// this host, not about TCP.
func TestConnErrorUnixSocket(t *testing.T) {
	dir := t.TempDir()
	err := connect(t, "postgres://app@/shop?host="+url.QueryEscape(dir)+"&port=5499&sslmode=disable")
	got := pgcore.ConnError("store", "op", err)
	msg := got.Error()
	t.Log(msg)
	sock := filepath.Join(dir, ".s.PGSQL.5499")
	assert.True(t, strings.HasPrefix(msg, `store: op: cannot reach Postgres at `+sock+` as user "app", database "shop": dial unix `+sock+": "), msg)
	assert.True(t, strings.HasSuffix(msg, ": check the socket directory and port in the connection URL (host=, port=, or PGHOST, PGPORT), and that Postgres runs on this host with its socket in that directory (unix_socket_directories)"), msg)
	assert.NotContains(t, msg, "TCP")
	assert.NotContains(t, msg, "\n")
	assert.ErrorIs(t, got, syscall.ENOENT)
}

// An error that is not a failed connection comes back as it is, and so
// does nil: a server error of a statement, a connection lost while in use,
// a joined error (whose type is not comparable).
func TestConnErrorLeavesOtherErrors(t *testing.T) {
	assert.NoError(t, pgcore.ConnError("store", "op", nil))
	for _, err := range []error{
		&pgconn.PgError{Code: "42P01", Message: `relation "x" does not exist`},
		&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET},
		oneline.Join(errors.New("a"), errors.New("b")),
		sql.ErrConnDone,
	} {
		assert.Equal(t, err, pgcore.ConnError("store", "op", err))
	}
}

// A driver that reports a refused connection with its own errors (lib/pq:
// its server error type, or the dial's *net.OpError) gets the same
// message without the server, which such errors do not carry: the dial
// error names the address, the server's answer the user or database.
func TestConnErrorOtherDriver(t *testing.T) {
	refused := &otherDriverError{Code: "28P01", Message: `password authentication failed for user "app"`}
	assert.Equal(t, `s: begin: password authentication failed for user "app" (SQLSTATE 28P01): check the user and password in the connection URL (or PGUSER, PGPASSWORD)`,
		pgcore.ConnError("s", "begin", refused).Error())

	missing := &otherDriverError{Code: "3D000", Message: `database "shop" does not exist`}
	assert.Equal(t, `s: begin: database "shop" does not exist (SQLSTATE 3D000): create the database (CREATE DATABASE "shop"), or name one that exists in the connection URL`,
		pgcore.ConnError("s", "begin", missing).Error())

	dial := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 6432}, Err: syscall.ECONNREFUSED}
	got := pgcore.ConnError("s", "begin", dial)
	assert.Equal(t, `s: begin: cannot reach Postgres: dial tcp 10.0.0.9:6432: connection refused: check the host and port in the connection URL (or PGHOST, PGPORT), and that Postgres runs there and accepts TCP connections from this host`, got.Error())
	assert.ErrorIs(t, got, syscall.ECONNREFUSED)

	socket := pgcore.Target{Host: "/var/run/postgresql", Port: 5432, User: "app", Database: "shop"}
	assert.Equal(t, `Postgres at /var/run/postgresql/.s.PGSQL.5432 as user "app", database "shop"`, socket.Where())
}
