package msgtest

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5/pgconn"
)

// Refusal is a connection to Postgres that fails, and what a store's
// message for it must say.
type Refusal struct {
	// Name says what fails ("wrong password").
	Name string
	// URL is the connection URL that fails.
	URL string
	// Cause opens the message, right after the store's prefix: the
	// server's answer, or "cannot reach Postgres at <address>".
	Cause string
	// Once is the phrase of the cause that the message names exactly once.
	Once string
	// Names are what the message names besides: the address, the user and
	// the database it connected with.
	Names []string
	// Fix ends the message.
	Fix string
	// Code is the SQLSTATE of the server's answer; "" for a connection
	// refused by the host (then errors.Is finds syscall.ECONNREFUSED).
	Code string
}

// Refusals are the connections to db's server that fail the way a new user
// meets them: a wrong password, a port nothing listens on, a database that
// does not exist, a role over its connection limit. Every URL has sslmode
// (with "prefer", as in a URL without it, pgx tries TLS first and the
// server refuses it before the real answer; lib/pq needs "disable").
func Refusals(t *testing.T, db *testenv.DB, sslmode string) []Refusal {
	t.Helper()
	base, err := url.Parse(db.DirectURL)
	if err != nil {
		t.Fatalf("msgtest: %s: %v", db.DirectURL, err)
	}
	q := base.Query()
	q.Set("sslmode", sslmode)
	base.RawQuery = q.Encode()
	addr := base.Host
	with := func(edit func(u *url.URL)) string {
		u := *base
		edit(&u)
		return u.String()
	}
	names := func(user, database string) []string {
		return []string{"Postgres at " + addr, `user "` + user + `"`, `database "` + database + `"`}
	}

	pwUser, _ := db.NewPasswordUser(t, "right-password")
	limited, _ := db.NewPasswordUser(t, "right-password")
	if _, err := db.Pool.Exec(context.Background(), `ALTER ROLE "`+limited+`" CONNECTION LIMIT 0`); err != nil {
		t.Fatalf("msgtest: connection limit: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	user := base.User.Username()
	missing := db.Name + "_missing"
	wrong := WrongPassword(addr, pwUser, db.Name)
	wrong.URL = with(func(u *url.URL) { u.User = url.UserPassword(pwUser, "wrong-password") })
	return []Refusal{wrong, {
		Name:  "dead port",
		URL:   with(func(u *url.URL) { u.Host = deadAddr }),
		Cause: "cannot reach Postgres at " + deadAddr,
		Once:  "connection refused",
		Names: []string{`user "` + user + `"`, `database "` + db.Name + `"`},
		Fix:   "check the host and port in the connection URL (or PGHOST, PGPORT), and that Postgres runs there and accepts TCP connections from this host",
	}, {
		Name:  "missing database",
		URL:   with(func(u *url.URL) { u.Path = "/" + missing }),
		Cause: `database "` + missing + `" does not exist (SQLSTATE 3D000)`,
		Once:  "does not exist",
		Names: names(user, missing),
		Fix:   `create the database (CREATE DATABASE "` + missing + `"), or name one that exists in the connection URL`,
		Code:  "3D000",
	}, {
		Name:  "connection limit",
		URL:   with(func(u *url.URL) { u.User = url.UserPassword(limited, "right-password") }),
		Cause: `too many connections for role "` + limited + `" (SQLSTATE 53300)`,
		Once:  "too many connections",
		Names: names(limited, db.Name),
		Fix:   `use fewer connections as this role (a smaller pool), or lift its limit: ALTER ROLE "` + limited + `" CONNECTION LIMIT -1`,
		Code:  "53300",
	}}
}

// WrongPassword is the Refusal of a wrong password for user, at addr
// (host:port), database; its URL is left empty.
func WrongPassword(addr, user, database string) Refusal {
	return Refusal{
		Name:  "wrong password",
		Cause: `password authentication failed for user "` + user + `" (SQLSTATE 28P01)`,
		Once:  "password authentication failed",
		Names: []string{"Postgres at " + addr, `user "` + user + `"`, `database "` + database + `"`},
		Fix:   "check the user and password in the connection URL (or PGUSER, PGPASSWORD)",
		Code:  "28P01",
	}
}

// CheckRefusal fails t unless err, which what returned over r's
// connection, is one line that starts with prefix and r.Cause, names
// r.Once exactly once and each of r.Names, ends with r.Fix, carries no
// layer prefix twice, and still holds the server's error (errors.As to an
// error with r.Code as its SQLSTATE) or the refused dial.
func CheckRefusal(t testing.TB, what string, err error, prefix string, r Refusal) {
	t.Helper()
	what = r.Name + ": " + what
	if err == nil {
		t.Errorf("%s: no error", what)
		return
	}
	msg := err.Error()
	t.Logf("%s: %s", what, msg)
	if strings.ContainsAny(msg, "\r\n") {
		t.Errorf("%s: the message spans lines: %q", what, msg)
	}
	if !strings.HasPrefix(msg, prefix+r.Cause) {
		t.Errorf("%s: want the message to start with %q, got %q", what, prefix+r.Cause, msg)
	}
	if n := strings.Count(msg, r.Once); n != 1 {
		t.Errorf("%s: %q is named %d times in %q, want once", what, r.Once, n, msg)
	}
	for _, name := range r.Names {
		if !strings.Contains(msg, name) {
			t.Errorf("%s: %q does not name %s", what, msg, name)
		}
	}
	if !strings.HasSuffix(msg, ": "+r.Fix) {
		t.Errorf("%s: want the message to end with the fix %q, got %q", what, r.Fix, msg)
	}
	for _, p := range Layers {
		if n := strings.Count(msg, p); n > 1 {
			t.Errorf("%s: prefix %q appears %d times in %q", what, p, n, msg)
		}
	}
	if r.Code == "" {
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s: errors.Is(err, syscall.ECONNREFUSED) is false for %q", what, msg)
		}
		return
	}
	var s interface{ SQLState() string }
	if !errors.As(err, &s) || s.SQLState() != r.Code {
		t.Errorf("%s: errors.As finds no server error with SQLSTATE %s in %q", what, r.Code, msg)
	}
}

// WalkRefused calls each of tg's calls that connect, over r's connection,
// and checks each message with CheckRefusal: store is the store's prefix
// ("pgfence"), after which each message names the step that connected.
func WalkRefused[Tx any](t *testing.T, ctx context.Context, tg Target[Tx], store string, r Refusal) {
	t.Helper()
	l := guardtest.Lease{Resource: "msg-refused", Tok: 1, Who: "a"}
	noop := func(context.Context, Tx) error { return nil }
	_, err := guard.Exec(ctx, tg.Store, l, noop)
	CheckRefusal(t, "Exec", err, store+": begin: ", r)
	_, err = guard.Exec(ctx, tg.Store, l, noop, guard.WithKey("k"))
	CheckRefusal(t, "Exec with a key", err, store+": begin: ", r)
	CheckRefusal(t, "Advance", tg.Advance(ctx, l), store+": advance: ", r)
	CheckRefusal(t, "run step", tg.Step(ctx, l, "run", "1"), store+": begin: ", r)
	CheckRefusal(t, "run finish", tg.Finish(ctx, l, "run"), store+": begin: ", r)
	_, _, err = tg.Resume(ctx, l, "run")
	CheckRefusal(t, "run resume", err, store+": resume: ", r)
	_, err = tg.Prune(ctx, 0)
	CheckRefusal(t, "Prune", err, store+": prune: ", r)
}

// WalkSQLRefusals runs a subtest per refusal: sqlfence over database/sql's
// driver on the refusal's URL, each of its calls that connect checked
// with WalkRefused; check gets the error of one more guard.Exec, for what
// the driver's own errors must still let errors.As find.
func WalkSQLRefusals(t *testing.T, driver string, refusals []Refusal, check func(t *testing.T, r Refusal, err error)) {
	t.Helper()
	for _, r := range refusals {
		t.Run(r.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			db, err := sql.Open(driver, r.URL)
			if err != nil {
				t.Fatalf("sql.Open(%q): %v", driver, err)
			}
			t.Cleanup(func() { _ = db.Close() })
			s, err := sqlfence.New(db)
			if err != nil {
				t.Fatal(err)
			}
			WalkRefused(t, ctx, StoreTarget[*sql.Tx, sqlfence.Run](s), "sqlfence", r)
			_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "msg-refused", Tok: 1, Who: "a"}, func(context.Context, *sql.Tx) error { return nil })
			check(t, r, err)
		})
	}
}

// Unaddressed is r as a store words it over a driver whose errors do not
// say which server they came from (lib/pq): no server, user or database
// beyond what the server's answer names, and a refused dial named by the
// dial's own address.
func (r Refusal) Unaddressed() Refusal {
	r.Names = nil
	r.Cause = strings.Replace(r.Cause, "cannot reach Postgres at ", "cannot reach Postgres: dial tcp ", 1)
	return r
}

// CheckPgxChain fails t unless pgx's own errors of r's refusal are still
// in err's chain for errors.As: the *pgconn.ConnectError, and the server's
// *pgconn.PgError with r.Code when the server answered.
func (r Refusal) CheckPgxChain(t testing.TB, err error) {
	t.Helper()
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		t.Errorf("errors.As finds no *pgconn.ConnectError in %v", err)
	}
	var pgErr *pgconn.PgError
	if got := errors.As(err, &pgErr); got != (r.Code != "") || got && pgErr.Code != r.Code {
		t.Errorf("errors.As(*pgconn.PgError) = %v (%v), want SQLSTATE %q", got, pgErr, r.Code)
	}
}
