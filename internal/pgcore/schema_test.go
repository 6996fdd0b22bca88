package pgcore

import (
	"database/sql"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The fix names a URL that connects where the Store does: a TCP host
// (IPv6 in brackets), a Unix socket directory as host=, sslmode=disable
// when the Store does not try TLS, the password masked; as the schema's
// owner when the Store's role is not; "$DATABASE_URL" when the host is
// unknown (the server's view over a Unix socket).
func TestSchemaFix(t *testing.T) {
	owned := Schema{Exists: true, User: "app", Owner: sql.NullString{String: "app", Valid: true}, IsOwner: sql.NullBool{Bool: true, Valid: true}, Database: "db"}
	other := owned
	other.Owner.String, other.IsOwner.Bool = "dba", false
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
			`run migrations.Up(ctx, db) on a connection as "dba", or: fencectl migrate up --db 'postgres://dba:xxxxx@h:5432/db' (with the password of "dba" in place of xxxxx)`},
		{"server view", Schema{Exists: true, User: "app", Database: "db", Addr: sql.NullString{String: "10.0.0.5", Valid: true}, Port: sql.NullInt64{Int64: 5432, Valid: true}}, nil,
			"run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db 'postgres://app:xxxxx@10.0.0.5:5432/db' (with the password in place of xxxxx)"},
		{"unknown host", owned, nil,
			`run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db "$DATABASE_URL" (the URL of database "db" as role "app")`},
	} {
		assert.Equal(t, c.want, c.s.Fix(c.t), c.name)
	}
}
