package pgcore

import (
	"os/user"
	"testing"

	"github.com/stretchr/testify/assert"
)

// libpqServer reads a connection string as lib/pq does: the string, then
// the PG* variables, then localhost:5432 as the system's user.
func TestLibpqServer(t *testing.T) {
	me := ""
	if u, err := user.Current(); err == nil {
		me = u.Username
	}
	env := func(vars map[string]string) func(string) string {
		return func(k string) string { return vars[k] }
	}
	none := env(nil)
	for _, c := range []struct {
		dsn  string
		env  func(string) string
		want Server
	}{
		{"postgres://app:pw@db:6432/shop?sslmode=disable", none, Server{"db", 6432, "app", "shop"}},
		{"postgresql://app@[::1]/shop", none, Server{"::1", 5432, "app", "shop"}},
		{"postgres://app@db/shop?host=other&dbname=inv", none, Server{"other", 5432, "app", "inv"}},
		{"postgres:///shop?host=/var/run/postgresql", none, Server{"/var/run/postgresql", 5432, me, "shop"}},
		{`host=/tmp port=5433 user='a b' dbname=x\ y password='it\'s'`, none, Server{"/tmp", 5433, "a b", "x y"}},
		{`user = app  dbname='sh\'op'`, none, Server{"localhost", 5432, "app", "sh'op"}},
		{"", env(map[string]string{"PGHOST": "h", "PGUSER": "u", "PGPORT": "7", "PGDATABASE": "d"}), Server{"h", 7, "u", "d"}},
		{"host=db user=app", env(map[string]string{"PGHOST": "h", "PGDATABASE": "d"}), Server{"db", 5432, "app", "d"}},
	} {
		got, ok := libpqServer(c.dsn, c.env)
		if assert.True(t, ok, c.dsn) {
			assert.Equal(t, c.want, got, c.dsn)
		}
	}
	for _, bad := range []string{"host='unterminated", "port=x", "justaword", "=v", "postgres://app@db:99999/x"} {
		_, ok := libpqServer(bad, none)
		assert.False(t, ok, bad)
	}
}
