package pgcore

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/fencelock/fencelock/guard"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SchemaVersion is the fencelock schema this fencelock needs: the last
// migration, 00005 (the outbox's bounded counts, outbox.Backlog's
// fencelock.outbox_backlog); the stores' own statements rely on 00004 (the
// fence lock and the read grant on every database, whichever files
// installed 00001 and 00002). A Store, and a relay, refuses to run
// against an older schema, so that an application that migrates at
// start-up has every function its fencelock calls, and a claim is never
// stored without the fence lock (an older claim's), which would not keep
// commits in token order. migrations' tests keep it at the last
// migration.
const SchemaVersion = 5

// SchemaVersionSQL is the version fencelock.schema_version() returns,
// read from the function's body in the catalog (every migration defines
// it as SELECT <version>) instead of calling it: no privilege is needed,
// so a role whose EXECUTE grant predates the function is checked too, and
// a missing schema or function is NULL, not an error. n is schema
// fencelock's pg_namespace row.
const SchemaVersionSQL = "(SELECT pg_catalog.substring(p.prosrc, 'SELECT[[:space:]]+([0-9]+)')::pg_catalog.int8 FROM pg_catalog.pg_proc p" +
	" WHERE p.pronamespace OPERATOR(pg_catalog.=) n.oid AND p.proname OPERATOR(pg_catalog.=) 'schema_version'" +
	" AND p.pronargs OPERATOR(pg_catalog.=) 0)"

// SchemaSQL reads, in one row and from the catalog only (no privilege
// needed, no error when anything is missing): whether schema fencelock
// exists; its version (SchemaVersionSQL); the session's role, the
// schema's owner and whether the role has the owner's rights; the
// database, and the server's address and port (NULL over a Unix socket).
const SchemaSQL = "SELECT n.oid IS NOT NULL, " + SchemaVersionSQL + "," +
	" CURRENT_USER::pg_catalog.text, pg_catalog.pg_get_userbyid(n.nspowner)::pg_catalog.text," +
	" pg_catalog.pg_has_role(n.nspowner, 'USAGE'), pg_catalog.current_database()::pg_catalog.text," +
	" pg_catalog.host(pg_catalog.inet_server_addr()), pg_catalog.inet_server_port()" +
	" FROM (SELECT) one LEFT JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) 'fencelock'"

// Schema is what SchemaSQL reads.
type Schema struct {
	Exists   bool
	Version  sql.NullInt64 // invalid: no fencelock.schema_version()
	User     string
	Owner    sql.NullString
	IsOwner  sql.NullBool
	Database string
	Addr     sql.NullString
	Port     sql.NullInt64
}

// Dest are the scan destinations of SchemaSQL's columns.
func (s *Schema) Dest() []any {
	return []any{&s.Exists, &s.Version, &s.User, &s.Owner, &s.IsOwner, &s.Database, &s.Addr, &s.Port}
}

// Target is where a Store's connections go, for a command to paste: the
// client's own settings when the driver shows them (pgfence), else the
// server's view of the session (sqlfence).
type Target struct {
	// Host is a host name or address, or the directory of a Unix socket;
	// "" when unknown.
	Host string
	Port uint16
	User string
	// Database is the database's name.
	Database string
	// Password: the connection gives one (it is masked in the command).
	Password bool
	// NoTLS: the connection does not try TLS (sslmode=disable).
	NoTLS bool
}

// PgxTarget is where db connects when it is a pgx pool or connection, from
// its configuration; nil for any other db.
func PgxTarget(db any) *Target {
	var cfg *pgx.ConnConfig
	switch db := db.(type) {
	case *pgxpool.Pool:
		cfg = db.Config().ConnConfig
	case *pgx.Conn:
		cfg = db.Config()
	default:
		return nil
	}
	return &Target{Host: cfg.Host, Port: cfg.Port, User: cfg.User, Database: cfg.Database,
		Password: cfg.Password != "", NoTLS: cfg.TLSConfig == nil}
}

// schemaChecked is set once a Store has found the schema it needs.
type schemaChecked struct{ ok atomic.Bool }

// CheckSchema returns nil when the database's fencelock schema is
// SchemaVersion or newer, and otherwise an error that matches
// guard.ErrSchemaMissing (guard.ErrSchemaOutdated too when the schema is
// there but older), naming the versions and the command that migrates it.
// The first success is remembered: a Store pays one round trip for it,
// once; a failure is asked again on the next call, so that the Store works
// as soon as the schema is migrated. Concurrent first calls may each ask.
// It is the first thing a Store's calls send, so a failed connection is
// reported here, as ConnError words it for op.
func (c *Core) CheckSchema(ctx context.Context, op string) error {
	if c.schema.ok.Load() {
		return nil
	}
	var s Schema
	if _, err := c.Driver.QueryRow(ctx, SchemaSQL, nil, s.Dest()...); err != nil {
		return Map(c.ConnError(op, err))
	}
	if err := s.Err(c.Target); err != nil {
		return err
	}
	c.schema.ok.Store(true)
	return nil
}

// Err is nil when s is SchemaVersion or newer, else the error CheckSchema
// returns; t is where the Store's connections go (nil: unknown, s says).
func (s Schema) Err(t *Target) error {
	if s.Exists && s.Version.Valid && s.Version.Int64 >= SchemaVersion {
		return nil
	}
	if !s.Exists {
		return &schemaError{msg: fmt.Sprintf("guard: fencelock schema not installed in database %q: %s", s.Database, s.Fix(t)), kind: guard.ErrSchemaMissing}
	}
	who := ""
	if owner, ok := s.OtherOwner(); ok {
		who = fmt.Sprintf("only the schema's owner, role %q, may migrate it (this Store connects as %q): ", owner, s.User)
	}
	return &schemaError{msg: fmt.Sprintf("%v: schema fencelock in database %q is at %s and this fencelock needs %d: %s%s",
		guard.ErrSchemaOutdated, s.Database, s.Have(), SchemaVersion, who, s.Fix(t)), kind: guard.ErrSchemaOutdated}
}

// Have is the schema's version as a message says it.
func (s Schema) Have() string {
	if s.Version.Valid {
		return "version " + strconv.FormatInt(s.Version.Int64, 10)
	}
	return "a version older than 3 (it has no fencelock.schema_version())"
}

// OtherOwner is the schema's owner when the session's role does not have
// its rights: only the owner may replace the functions.
func (s Schema) OtherOwner() (string, bool) {
	if s.Exists && s.Owner.Valid && !s.IsOwner.Bool && s.Owner.String != s.User {
		return s.Owner.String, true
	}
	return "", false
}

// Fix is the command that migrates the database: migrations.Up, or
// fencectl with the URL of t (nil: the server's view of the session), as
// the schema's owner when the session's role does not have its rights.
func (s Schema) Fix(t *Target) string {
	var where Target
	if t != nil {
		where = *t
	} else {
		where = Target{Host: s.Addr.String, Port: uint16(s.Port.Int64), User: s.User, Database: s.Database, Password: true}
	}
	up, whose := "run migrations.Up(ctx, db) at start-up", ""
	if owner, ok := s.OtherOwner(); ok {
		where.User, where.Password = owner, true
		up = fmt.Sprintf("run migrations.Up(ctx, db) on a connection as %q", owner)
		whose = fmt.Sprintf(" of %q", owner)
	}
	if where.Host == "" {
		return fmt.Sprintf("%s, or: fencectl migrate up --db \"$DATABASE_URL\" (the URL of database %q as role %q)", up, where.Database, where.User)
	}
	u, masked := where.url()
	cmd := fmt.Sprintf("%s, or: fencectl migrate up --db '%s'", up, u)
	if masked {
		cmd += fmt.Sprintf(" (with the password%s in place of %s)", whose, passwordMask)
	}
	return cmd
}

// passwordMask stands for a password in a URL, as fencectl writes it.
const passwordMask = "xxxxx"

// url is t as a postgres:// URL, its password masked; masked says whether
// it has one.
func (t Target) url() (string, bool) {
	u := url.URL{Scheme: "postgres", Path: "/" + t.Database}
	q := url.Values{}
	if strings.HasPrefix(t.Host, "/") {
		q.Set("host", t.Host)
		if t.Port != 0 {
			q.Set("port", strconv.Itoa(int(t.Port)))
		}
	} else {
		u.Host = t.Host
		if t.Port != 0 {
			u.Host = net.JoinHostPort(t.Host, strconv.Itoa(int(t.Port)))
		}
	}
	if t.NoTLS {
		q.Set("sslmode", "disable")
	}
	u.RawQuery = q.Encode()
	if t.Password {
		u.User = url.UserPassword(t.User, passwordMask)
	} else {
		u.User = url.User(t.User)
	}
	return u.String(), t.Password
}

// schemaError is an error of CheckSchema: its own message, matching kind
// (and what kind matches) without repeating kind's text.
type schemaError struct {
	msg  string
	kind error
}

func (e *schemaError) Error() string { return e.msg }
func (e *schemaError) Unwrap() error { return e.kind }
