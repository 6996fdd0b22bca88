package msgtest

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

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
	for _, s := range strings.Split(strings.TrimSuffix(sql, ";"), "; ") {
		p.SQL = append(p.SQL, s)
	}
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
