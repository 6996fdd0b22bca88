package pgcore

import (
	"database/sql"
	"net/url"
	"os"
	"os/user"
	"reflect"
	"strconv"
	"strings"
)

// SQLConnError is ConnError for an error from db: pgx's database/sql
// driver reports a failed connection as pgx does; lib/pq's errors do not
// say where they connected, so the server, user and database come from
// db's connection string, read as lib/pq reads it (when db was opened
// with sql.Open("postgres", dsn); with sql.OpenDB the message names the
// address the dial names, if any).
func SQLConnError(prefix, op string, db *sql.DB, err error) error {
	return ConnErrorAt(prefix, op, err, func() (Target, bool) { return SQLTarget(db) })
}

// SQLTarget is where lib/pq connects db, read from the connection string
// db was opened with (sql.Open("postgres", dsn)); false for another
// driver, or a db opened with sql.OpenDB. database/sql keeps that string
// unexported (DB.connector, a dsnConnector with a dsn field): it is read,
// never written, and a database/sql without those fields only costs the
// message the server's name.
func SQLTarget(db *sql.DB) (Target, bool) {
	if db == nil || reflect.TypeOf(db.Driver()).String() != "*pq.Driver" {
		return Target{}, false
	}
	c := reflect.ValueOf(db).Elem().FieldByName("connector")
	if c.Kind() != reflect.Interface || c.IsNil() {
		return Target{}, false
	}
	if c = c.Elem(); c.Kind() != reflect.Struct {
		return Target{}, false
	}
	dsn := c.FieldByName("dsn")
	if dsn.Kind() != reflect.String {
		return Target{}, false
	}
	return libpqTarget(dsn.String(), os.Getenv)
}

// libpqTarget is where lib/pq connects with dsn (a postgres:// URL or
// key=value pairs): what dsn says, else the PG* environment variables,
// else localhost:5432 as the operating system's user.
func libpqTarget(dsn string, getenv func(string) string) (Target, bool) {
	o := map[string]string{"host": "localhost", "port": "5432"}
	for k, env := range map[string]string{"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "dbname": "PGDATABASE"} {
		if v := getenv(env); v != "" {
			o[k] = v
		}
	}
	var ok bool
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		ok = urlSettings(dsn, o)
	} else {
		ok = keyValues(dsn, o)
	}
	if !ok {
		return Target{}, false
	}
	if o["user"] == "" {
		if u, err := user.Current(); err == nil {
			o["user"] = u.Username
		} else {
			o["user"] = getenv("USER")
		}
	}
	port, err := strconv.ParseUint(o["port"], 10, 16)
	if err != nil {
		return Target{}, false
	}
	return Target{Host: o["host"], Port: uint16(port), User: o["user"], Database: o["dbname"]}, true
}

// urlSettings puts the settings of a postgres:// URL into o.
func urlSettings(dsn string, o map[string]string) bool {
	u, err := url.Parse(dsn)
	if err != nil {
		return false
	}
	if u.User != nil {
		o["user"] = u.User.Username()
	}
	if h := u.Hostname(); h != "" {
		o["host"] = h
	}
	if p := u.Port(); p != "" {
		o["port"] = p
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		o["dbname"] = db
	}
	for k, vs := range u.Query() {
		o[k] = vs[len(vs)-1]
	}
	return true
}

// keyValues puts the settings of "key=value key='a value'" into o: values
// are single-quoted or end at a space, and a backslash takes the next
// character as it is.
func keyValues(dsn string, o map[string]string) bool {
	s := strings.TrimSpace(dsn)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return false
		}
		key := strings.TrimSpace(s[:eq])
		if key == "" || strings.ContainsAny(key, " \t\n") {
			return false
		}
		s = strings.TrimLeft(s[eq+1:], " \t\n")
		var val strings.Builder
		quote := strings.HasPrefix(s, "'")
		if quote {
			s = s[1:]
		}
		closed := !quote
		i := 0
		for ; i < len(s); i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				val.WriteByte(s[i])
				continue
			}
			if quote && c == '\'' {
				closed = true
				i++
				break
			}
			if !quote && (c == ' ' || c == '\t' || c == '\n') {
				break
			}
			val.WriteByte(c)
		}
		if !closed {
			return false
		}
		o[key] = val.String()
		s = strings.TrimLeft(s[i:], " \t\n")
	}
	return true
}
