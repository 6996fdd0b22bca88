package pgcore

import (
	"database/sql"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The fix names a URL that connects where the Store does: a TCP host
// (IPv6 in brackets), a Unix socket directory as host=, sslmode=disable
// when the Store does not try TLS, the password masked; as the schema's
// owner, named by the URL alone, when the Store's role is not. Without
// the Store's own target it is the server's view of the session, said to
// be so: its address, or its first socket directory; a placeholder for
// the URL when neither is known (a socket whose directory the role may
// not read), never an environment variable.
func TestSchemaFix(t *testing.T) {
	owned := Schema{Exists: true, User: "app", Owner: sql.NullString{String: "app", Valid: true}, IsOwner: sql.NullBool{Bool: true, Valid: true}, Database: "db"}
	other := owned
	other.Owner.String, other.IsOwner.Bool = "dba", false
	viewed := func(s Schema, addr, dirs string) Schema {
		s.Addr = sql.NullString{String: addr, Valid: addr != ""}
		s.SocketDirs = sql.NullString{String: dirs, Valid: dirs != ""}
		s.Port = sql.NullInt64{Int64: 5432, Valid: true}
		return s
	}
	const seen = "the address is the server's own, as Postgres sees it: use the URL you connect with if it differs"
	for _, c := range []struct {
		name string
		s    Schema
		t    *Target
		want string
	}{
		{"tcp", owned, &Target{Host: "db.example", Port: 5432, User: "app", Database: "db", NoTLS: true},
			"run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db 'postgres://app@db.example:5432/db?sslmode=disable'"},
		{"password", owned, &Target{Host: "::1", Port: 6432, User: "app", Database: "db", Password: true},
			"run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db 'postgres://app:xxxxx@[::1]:6432/db' (with the password in place of xxxxx)"},
		{"socket", owned, &Target{Host: "/run/postgresql", Port: 5433, User: "app", Database: "db"},
			"run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db 'postgres://app@/db?host=%2Frun%2Fpostgresql&port=5433'"},
		{"owner", other, &Target{Host: "h", Port: 5432, User: "app", Database: "db"},
			"run migrations.Up(ctx, db) on a connection as the owner, or: fencectl migrate up --db 'postgres://dba:xxxxx@h:5432/db' (with the owner's password in place of xxxxx)"},
		{"server view", viewed(owned, "10.0.0.5", "/run/postgresql"), nil,
			"run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db 'postgres://app:xxxxx@10.0.0.5:5432/db' (with the password in place of xxxxx; " + seen + ")"},
		{"server view, owner", viewed(other, "10.0.0.5", ""), nil,
			"run migrations.Up(ctx, db) on a connection as the owner, or: fencectl migrate up --db 'postgres://dba:xxxxx@10.0.0.5:5432/db' (with the owner's password in place of xxxxx; " + seen + ")"},
		{"server view, socket", viewed(owned, "", `@abstract, "/tmp/a, ""b""" ,/run/postgresql`), nil,
			"run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db 'postgres://app:xxxxx@/db?host=%2Ftmp%2Fa%2C+%22b%22&port=5432' (with the password in place of xxxxx; " + seen + ")"},
		{"unknown host", viewed(owned, "", ""), nil,
			`run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db '<the URL of database "db" as role "app">'`},
		{"unknown host, owner", viewed(other, "", ""), nil,
			`run migrations.Up(ctx, db) on a connection as the owner, or: fencectl migrate up --db '<the URL of database "db" as the owner>'`},
	} {
		assert.Equal(t, c.want, c.s.Fix(c.t), c.name)
	}
}

// The first socket directory of unix_socket_directories, as Postgres
// splits it: commas between entries, blanks around them, double quotes
// around an entry that holds either ("" a quote); not an abstract socket.
func TestFirstSocketDir(t *testing.T) {
	for list, want := range map[string]string{
		"/var/run/postgresql": "/var/run/postgresql",
		" /tmp/a , /tmp/b":    "/tmp/a",
		`"/tmp/x,y", /tmp`:    "/tmp/x,y",
		`"/tmp/""q"""`:        `/tmp/"q"`,
		"@abstract,/tmp":      "/tmp",
		"":                    "",
		"@only":               "",
		`"unterminated`:       "",
	} {
		assert.Equal(t, want, firstSocketDir(list), "%q", list)
	}
}

// A Store whose role is not the schema's owner is told so once: the owner
// is named in the message's prose once, and in the fix's URL.
func TestSchemaErrNamesOwnerOnce(t *testing.T) {
	s := Schema{Exists: true, Version: sql.NullInt64{Int64: 4, Valid: true}, User: "app",
		Owner: sql.NullString{String: "dba", Valid: true}, IsOwner: sql.NullBool{Valid: true}, Database: "db"}
	msg := s.Err(&Target{Host: "h", Port: 5432, User: "app", Database: "db"}).Error()
	assert.Equal(t, `guard: fencelock schema out of date: schema fencelock in database "db" is at version 4 and this fencelock needs `+strconv.Itoa(SchemaVersion)+`: `+
		`only the schema's owner, role "dba", may migrate it (this Store connects as "app"): `+
		`run migrations.Up(ctx, db) on a connection as the owner, or: fencectl migrate up --db 'postgres://dba:xxxxx@h:5432/db' (with the owner's password in place of xxxxx)`, msg)
}
