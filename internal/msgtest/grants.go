package msgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
)

// AppGrants are the statements docs/operations.md gives an application
// role (%[1]s: the role; %[2]s: the role that runs the migrations, whose
// future functions the default privileges cover), in its order.
var AppGrants = []string{
	"GRANT USAGE ON SCHEMA fencelock TO %[1]s",
	"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO %[1]s",
	"ALTER DEFAULT PRIVILEGES FOR ROLE %[2]s IN SCHEMA fencelock GRANT EXECUTE ON FUNCTIONS TO %[1]s",
}

// Psql is a psql command line a fix prints.
type Psql struct {
	User, Database string // -U (empty when not given), -d
	SQL            []string
}

// psqlLine is "psql [-U user] -d db -c sql", each a shell word.
var psqlLine = regexp.MustCompile(`psql(?: -U ('(?:[^']|'\\'')*'|[^\s']+))? -d ('(?:[^']|'\\'')*'|[^\s']+) -c ('(?:[^']|'\\'')*'|[^\s']+)`)

// ParsePsql finds the psql command of a fix in msg, as a shell would read
// it, and fails t when there is none. Its SQL is split into statements,
// each of which must end with ';'.
func ParsePsql(t testing.TB, msg string) Psql {
	t.Helper()
	m := psqlLine.FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("no psql command in %q", msg)
	}
	p := Psql{User: unshell(m[1]), Database: unshell(m[2])}
	sql := unshell(m[3])
	if !strings.HasSuffix(sql, ";") {
		t.Fatalf("the fix's SQL %q does not end with ';'", sql)
	}
	p.SQL = strings.Split(strings.TrimSuffix(sql, ";"), "; ")
	return p
}

func unshell(w string) string {
	if strings.HasPrefix(w, "'") {
		return strings.ReplaceAll(w[1:len(w)-1], `'\''`, "'")
	}
	return w
}

// String is p as typed.
func (p Psql) String() string {
	return fmt.Sprintf("psql -U %s -d %s -c %q", p.User, p.Database, strings.Join(p.SQL, "; "))
}

// Run runs p as it is printed: connected as its -U role (adminURL's user
// when it names none: an admin) to its database on adminURL's server,
// each statement in turn, as psql -c would; it fails t on any error.
func (p Psql) Run(t testing.TB, adminURL string) {
	t.Helper()
	u, err := url.Parse(adminURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + p.Database
	if p.User != "" && p.User != u.User.Username() {
		u.User = url.User(p.User)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("%s: connect: %v", p, err)
	}
	defer conn.Close(context.Background())
	for _, stmt := range p.SQL {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %s: %v", p, stmt, err)
		}
	}
}

// NewAppRole creates a login role with the grants AppGrants lists less
// those whose index is in skip, made by db's user (the schema's owner in
// tests), on the fencelock schema as it is now, and returns the role's
// name and db's URL as that role. Roles are global to the server: the
// name is unique, and the role is dropped when t ends.
func NewAppRole(t testing.TB, db *testenv.DB, skip ...int) (role, roleURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role = "fl_app_" + hex.EncodeToString(b)
	if _, err := db.Pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN NOSUPERUSER NOINHERIT"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = db.Pool.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = db.Pool.Exec(ctx, "DROP ROLE IF EXISTS "+role)
	})
	var owner string
	if err := db.Pool.QueryRow(ctx, "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'fencelock'").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	for i, g := range AppGrants {
		if !slices.Contains(skip, i) {
			if _, err := db.Pool.Exec(ctx, fmt.Sprintf(g, role, owner)); err != nil {
				t.Fatal(err)
			}
		}
	}
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return role, u.String()
}
