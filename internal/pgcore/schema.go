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
// database; the server's address (NULL over a Unix socket) and port; and
// its socket directories (unix_socket_directories, read through
// pg_settings, which hides it from a role that is neither a superuser
// nor a member of pg_read_all_settings: NULL then, where current_setting
// would fail).
const SchemaSQL = "SELECT n.oid IS NOT NULL, " + SchemaVersionSQL + "," +
	" CURRENT_USER::pg_catalog.text, pg_catalog.pg_get_userbyid(n.nspowner)::pg_catalog.text," +
	" pg_catalog.pg_has_role(n.nspowner, 'USAGE'), pg_catalog.current_database()::pg_catalog.text," +
	" pg_catalog.host(pg_catalog.inet_server_addr())," +
	" COALESCE(pg_catalog.inet_server_port(), pg_catalog.current_setting('port')::pg_catalog.int4)," +
	" (SELECT s.setting FROM pg_catalog.pg_settings s WHERE s.name OPERATOR(pg_catalog.=) 'unix_socket_directories')" +
	" FROM (SELECT) one LEFT JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) 'fencelock'"

// Schema is what SchemaSQL reads.
type Schema struct {
	Exists   bool
	Version  sql.NullInt64 // invalid: no fencelock.schema_version()
	User     string
	Owner    sql.NullString
	IsOwner  sql.NullBool
	Database string
	Addr     sql.NullString // invalid over a Unix socket
	Port     sql.NullInt64
	// SocketDirs is unix_socket_directories; invalid when the role may
	// not read it.
	SocketDirs sql.NullString
}

// Dest are the scan destinations of SchemaSQL's columns.
func (s *Schema) Dest() []any {
	return []any{&s.Exists, &s.Version, &s.User, &s.Owner, &s.IsOwner, &s.Database, &s.Addr, &s.Port, &s.SocketDirs}
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

// DriverTarget is where a database/sql driver connection (what
// sql.Conn.Raw gives) goes, from its configuration when the driver shows
// it (pgx's stdlib: a *stdlib.Conn); nil for any other driver (lib/pq).
func DriverTarget(driverConn any) *Target {
	if c, ok := driverConn.(interface{ Conn() *pgx.Conn }); ok {
		return PgxTarget(c.Conn())
	}
	return nil
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
	return &schemaError{msg: fmt.Sprintf("guard: fencelock schema out of date: schema fencelock in database %q is at %s and this fencelock needs %d: %s%s",
		s.Database, s.Have(), SchemaVersion, who, s.Fix(t)), kind: guard.ErrSchemaOutdated}
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
// fencectl with the URL of t, as the schema's owner (whom the caller's
// message names) when the session's role does not have its rights. With
// t nil the URL is the server's view of the session (sqlfence, whose
// database/sql handle does not show where it connects): the server's own
// address, which is the one the client dialled unless a pooler, NAT, a
// mapped port or a mounted socket directory stands between them (the fix
// says so), or, over a Unix socket whose directory the role may not
// read, a placeholder for the URL: never an address the server did not
// give.
func (s Schema) Fix(t *Target) string {
	where, seen := s.serverTarget(), true
	if t != nil {
		where, seen = *t, false
	}
	up, pw, as := "run migrations.Up(ctx, db) at start-up", "the password", fmt.Sprintf("role %q", where.User)
	if owner, ok := s.OtherOwner(); ok {
		where.User, where.Password = owner, true
		up, pw, as = "run migrations.Up(ctx, db) on a connection as the owner", "the owner's password", "the owner"
	}
	if where.Host == "" {
		return fmt.Sprintf("%s, or: fencectl migrate up --db '<the URL of database %q as %s>'", up, where.Database, as)
	}
	u, masked := where.url()
	cmd := fmt.Sprintf("%s, or: fencectl migrate up --db '%s'", up, u)
	var notes []string
	if masked {
		notes = append(notes, "with "+pw+" in place of "+passwordMask)
	}
	if seen {
		notes = append(notes, "the address is the server's own, as Postgres sees it: use the URL you connect with if it differs")
	}
	if len(notes) > 0 {
		cmd += " (" + strings.Join(notes, "; ") + ")"
	}
	return cmd
}

// serverTarget is where the session is connected as the server sees it:
// its address, or its first socket directory; no host when neither is
// known. A password is assumed.
func (s Schema) serverTarget() Target {
	t := Target{Port: uint16(s.Port.Int64), User: s.User, Database: s.Database, Password: true}
	switch {
	case s.Addr.Valid:
		t.Host = s.Addr.String
	case s.SocketDirs.Valid:
		t.Host = firstSocketDir(s.SocketDirs.String)
	}
	return t
}

// firstSocketDir is the first directory of a unix_socket_directories
// value (a comma-separated list whose entries may be double-quoted, ""
// standing for a quote), or "" when it names none. Entries that are not
// absolute paths (an abstract socket's @name) are skipped: a client
// could not dial them as a host.
func firstSocketDir(list string) string {
	for rest := list; rest != ""; {
		var dir string
		rest = strings.TrimLeft(rest, " \t")
		if strings.HasPrefix(rest, `"`) {
			var b strings.Builder
			i := 1
			for ; i < len(rest); i++ {
				if rest[i] == '"' {
					if i+1 < len(rest) && rest[i+1] == '"' {
						b.WriteByte('"')
						i++
						continue
					}
					break
				}
				b.WriteByte(rest[i])
			}
			dir, rest = b.String(), rest[min(i+1, len(rest)):]
			_, rest, _ = strings.Cut(rest, ",")
		} else {
			dir, rest, _ = strings.Cut(rest, ",")
			dir = strings.TrimRight(dir, " \t")
		}
		if strings.HasPrefix(dir, "/") {
			return dir
		}
	}
	return ""
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
	// err is the driver's error it words, if any.
	err error
}

func (e *schemaError) Error() string { return e.msg }
func (e *schemaError) Unwrap() []error {
	if e.err == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.err}
}
