package pgcore

import (
	"os/user"
	"testing"

	"github.com/stretchr/testify/assert"
)

// libpqTarget reads a connection string as lib/pq does: the string, then
// the PG* variables, then localhost:5432 as the system's user.
func TestLibpqTarget(t *testing.T) {
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
		want Target
	}{
		{"postgres://app:pw@db:6432/shop?sslmode=disable", none, Target{Host: "db", Port: 6432, User: "app", Database: "shop"}},
		{"postgresql://app@[::1]/shop", none, Target{Host: "::1", Port: 5432, User: "app", Database: "shop"}},
		{"postgres://app@db/shop?host=other&dbname=inv", none, Target{Host: "other", Port: 5432, User: "app", Database: "inv"}},
		{"postgres:///shop?host=/var/run/postgresql", none, Target{Host: "/var/run/postgresql", Port: 5432, User: me, Database: "shop"}},
		{`host=/tmp port=5433 user='a b' dbname=x\ y password='it\'s'`, none, Target{Host: "/tmp", Port: 5433, User: "a b", Database: "x y"}},
		{`user = app  dbname='sh\'op'`, none, Target{Host: "localhost", Port: 5432, User: "app", Database: "sh'op"}},
		{"", env(map[string]string{"PGHOST": "h", "PGUSER": "u", "PGPORT": "7", "PGDATABASE": "d"}), Target{Host: "h", Port: 7, User: "u", Database: "d"}},
		{"host=db user=app", env(map[string]string{"PGHOST": "h", "PGDATABASE": "d"}), Target{Host: "db", Port: 5432, User: "app", Database: "d"}},
	} {
		got, ok := libpqTarget(c.dsn, c.env)
		if assert.True(t, ok, c.dsn) {
			assert.Equal(t, c.want, got, c.dsn)
		}
	}
	for _, bad := range []string{"host='unterminated", "port=x", "justaword", "=v", "postgres://app@db:99999/x"} {
		_, ok := libpqTarget(bad, none)
		assert.False(t, ok, bad)
	}
}
