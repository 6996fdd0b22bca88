package pgcore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/fencelock/fencelock/guard"
)

// InsufficientPrivilege is SQLSTATE 42501, a privilege the role lacks.
const InsufficientPrivilege = "42501"

// The one place that words a refusal (42501) of the fencelock schema for
// every store, driver and caller (pgfence, sqlfence, the outbox's relay
// and operators' calls, migrations): which role lacks what, on which
// object, and the statements the schema's owner runs, connected to the
// database where they must run. The role, the database and the owner come
// from the catalog (SchemaSQL), which every role may read.

// deniedObject reads Postgres's refusal: "permission denied for schema
// fencelock", "permission denied for function advance", "permission
// denied for table outbox", "permission denied for database fresh".
var deniedObject = regexp.MustCompile(`permission denied for (schema|function|procedure|table|relation|sequence|database) "?([^"\s]+)"?`)

// Denial is what a refusal names: the kind of object and its name.
type Denial struct{ Kind, Object string }

// ParseDenial reads the object a refusal names from its message.
func ParseDenial(msg string) (Denial, bool) {
	m := deniedObject.FindStringSubmatch(msg)
	if m == nil {
		return Denial{}, false
	}
	return Denial{Kind: m[1], Object: m[2]}, true
}

// ExplainPermission is Explain for a refusal (42501): when it concerns
// the fencelock schema, the error PermissionError words, after one more
// round trip to read the role, the database and the schema's owner (on
// this failure path only); any other refusal (fn's own tables) is
// returned as it came.
func (c *Core) ExplainPermission(ctx context.Context, err error) error {
	if Code(err) != InsufficientPrivilege {
		return err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), guard.RollbackTimeout)
	defer cancel()
	var s Schema
	if _, qerr := c.Driver.QueryRow(rctx, SchemaSQL, nil, s.Dest()...); qerr != nil {
		return err
	}
	var fn bool
	if d, ok := ParseDenial(errMessage(err)); ok && d.Kind == "function" {
		if _, qerr := c.Driver.QueryRow(rctx, FencelockFunctionSQL, []any{d.Object}, &fn); qerr != nil {
			return err
		}
	}
	return PermissionError(c.Name+": ", s, fn, err)
}

// FencelockFunctionSQL is whether schema fencelock has a function of the
// name $1: a refusal names a function without its schema.
const FencelockFunctionSQL = "SELECT EXISTS (SELECT FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace" +
	" WHERE n.nspname OPERATOR(pg_catalog.=) 'fencelock' AND p.proname OPERATOR(pg_catalog.=) $1)"

func errMessage(err error) string {
	if e, ok := From(err); ok {
		return e.Message
	}
	return err.Error()
}

// PermissionError words err, a refusal (42501) met by the session s
// describes, under prefix ("pgfence: ", "outbox: relay: "): a
// *PermissionErr matching guard.ErrPermission and err when it concerns
// the fencelock schema (its USAGE, a function of it, when fn says the
// refused function is one of fencelock's, or one of its tables), else
// err unchanged.
func PermissionError(prefix string, s Schema, fn bool, err error) error {
	return RefusalError(prefix, "nothing was written", s, fn, err)
}

// RefusalError is PermissionError saying so what follows from the
// refusal ("nothing was written", "it cannot claim").
func RefusalError(prefix, so string, s Schema, fn bool, err error) error {
	d, ok := ParseDenial(errMessage(err))
	if !ok {
		return err
	}
	role := QuoteIdent(s.User)
	var lacks string
	var grants []string
	switch {
	case d.Kind == "schema" && d.Object == "fencelock":
		lacks = "USAGE on schema fencelock"
		grants = AppGrants(s.User, s.Owner.String)
	case (d.Kind == "function" || d.Kind == "procedure") && fn:
		lacks = "EXECUTE on function fencelock." + d.Object
		grants = AppGrants(s.User, s.Owner.String)[1:]
	case (d.Kind == "table" || d.Kind == "relation") && d.Object == "outbox":
		// The migrations grant these columns to PUBLIC: someone revoked
		// them.
		lacks = "INSERT on table fencelock.outbox"
		grants = []string{"GRANT INSERT (resource, token, holder, destination, key, payload, headers, ordered, dead_at, last_error), SELECT (id) ON fencelock.outbox TO " + role}
	default:
		return err
	}
	return Lacks(prefix, s, lacks, so, grants, err)
}

// Lacks is the error of a role that lacks a privilege on the fencelock
// schema, found by the server's refusal err or (err nil) read from the
// catalog: lacks is what it lacks ("USAGE on schema fencelock"), so what
// follows ("nothing was written"), grants what the schema's owner runs.
func Lacks(prefix string, s Schema, lacks, so string, grants []string, err error) *PermissionErr {
	return &PermissionErr{msg: fmt.Sprintf("%srole %q lacks %s, so %s: %s",
		prefix, s.User, lacks, so, OwnerFix(s, grants)), err: err}
}

// AppGrants are the statements that give role what an application needs
// of the fencelock schema, as docs/operations.md lists them: USAGE,
// EXECUTE on every function, and EXECUTE on the functions that later
// migrations add (default privileges for the functions that owner, the
// role that runs the migrations, creates; without an owner, the role that
// runs the statement).
func AppGrants(role, owner string) []string {
	r := QuoteIdent(role)
	def := "ALTER DEFAULT PRIVILEGES IN SCHEMA fencelock GRANT EXECUTE ON FUNCTIONS TO " + r
	if owner != "" {
		def = "ALTER DEFAULT PRIVILEGES FOR ROLE " + QuoteIdent(owner) + " IN SCHEMA fencelock GRANT EXECUTE ON FUNCTIONS TO " + r
	}
	return []string{"GRANT USAGE ON SCHEMA fencelock TO " + r, "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO " + r, def}
}

// OwnerFix is who runs grants, and where: the schema's owner, connected to
// s's database, as a psql command line that works when pasted (each
// statement ends with ';').
func OwnerFix(s Schema, grants []string) string { return ownerSQLFix(s, grants).String() }

func ownerSQLFix(s Schema, grants []string) SQLFix {
	f := SQLFix{Who: "the schema's owner", Database: s.Database, Stmts: grants}
	if s.Owner.Valid && s.Owner.String != "" {
		f.Who, f.Role = fmt.Sprintf("the schema's owner (role %q)", s.Owner.String), s.Owner.String
	}
	return f
}

// SQLFix is SQL that mends a refusal, whom to run it as and where: a
// message prints it as one psql command line (String), fencectl one
// statement a line.
type SQLFix struct {
	// Who runs it, as a message says it: "the schema's owner (role
	// \"x\")", "an admin (a superuser, or the database's owner)".
	Who string
	// Role is the role to connect as (psql -U), "" when the message cannot
	// name one (an admin).
	Role string
	// Database is where to connect: grants on a schema are per database.
	Database string
	// Stmts are the statements, without their ';'.
	Stmts []string
}

// String is "as Who, run in database "d": psql -U role -d d -c '...;'".
func (f SQLFix) String() string {
	user := ""
	if f.Role != "" {
		user = " -U " + ShellQuote(f.Role)
	}
	return fmt.Sprintf("as %s, run in database %q: psql%s -d %s -c %s", f.Who, f.Database, user,
		ShellQuote(f.Database), ShellQuote(strings.Join(f.Stmts, "; ")+";"))
}

// QuoteIdent quotes a SQL identifier when it needs it (not lower-case
// letters, digits and '_', or starting with a digit).
func QuoteIdent(s string) string {
	plain := s != "" && !('0' <= s[0] && s[0] <= '9')
	for _, c := range s {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			plain = false
		}
	}
	if plain {
		return s
	}
	return ident(s)
}

// ShellQuote quotes s for a POSIX shell, in single quotes when it needs
// any.
func ShellQuote(s string) string {
	plain := s != ""
	for _, c := range s {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.ContainsRune("_-./:=@", c)) {
			plain = false
		}
	}
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// PermissionErr is a refusal of the fencelock schema, worded: it matches
// guard.ErrPermission and the driver's error.
type PermissionErr struct {
	msg string
	err error
}

func (e *PermissionErr) Error() string { return e.msg }
func (e *PermissionErr) Unwrap() []error {
	if e.err == nil {
		return []error{guard.ErrPermission}
	}
	return []error{guard.ErrPermission, e.err}
}

// Migrating needs more than an application: CREATE on the database (for
// schema fencelock) and on the schema where goose keeps its version table
// (the first of the search_path) to install the schema; its ownership to
// change it; the version table to read what is applied. A refusal of
// these is worded here too, for migrations' Up, Down and Status and for
// fencectl's migrate commands, each in its own words.

// MigrationCase is what a refused migration lacks.
type MigrationCase int

const (
	// NeedsCreate: the role may not create schema fencelock or the
	// version table; an admin's grants (Fix) let it.
	NeedsCreate MigrationCase = iota + 1
	// NeedsOwner: schema fencelock exists and only its owner (Only) may
	// change it: no grant mends that.
	NeedsOwner
	// NeedsTableOwner: there is no schema fencelock, and the version
	// table that another role (Only) left (its Down, or an Up that
	// failed) refuses this one: only that role may migrate, or drop the
	// table (Fix), which records nothing to keep.
	NeedsTableOwner
	// NeedsTableGrant: schema fencelock exists and the role may not read
	// the version table (or, to migrate, write it); its owner's grant
	// (Fix) lets it.
	NeedsTableGrant
)

// MigrationErr is a migration refused (SQLSTATE 42501), worded: which
// role lacks what, on which object, and the SQL that mends it, whom to
// run it as and in which database, or the one role that may migrate. It
// matches guard.ErrPermission and the driver's error.
type MigrationErr struct {
	Case MigrationCase
	// Op is "up", "down" or "status".
	Op string
	// Role is the session's role; Lacks what it lacks, on which object.
	Role, Lacks string
	// Only is the one role that may do Op (NeedsOwner, NeedsTableOwner).
	Only string
	// Table is the version table.
	Table string
	// Fix is the SQL that mends the refusal; nil for NeedsOwner.
	Fix *SQLFix
	err error
}

func (e *MigrationErr) Error() string {
	call, so := "the migration", "it cannot migrate schema fencelock"
	switch e.Op {
	case "up":
		call, so = "migrations.Up", "it cannot install or migrate schema fencelock"
	case "down":
		call, so = "migrations.Down", "it cannot drop schema fencelock"
	case "status":
		call, so = "migrations.Status", "it cannot read which migrations are applied"
	}
	head := fmt.Sprintf("migrations: %s: role %q lacks %s, so %s: ", e.Op, e.Role, e.Lacks, so)
	switch e.Case {
	case NeedsCreate:
		return head + "run " + call + " as the role that is to own schema fencelock, or let this role create it: " + e.Fix.String()
	case NeedsOwner:
		return head + fmt.Sprintf("only its owner, role %q, may: run %s on a connection as that role", e.Only, call)
	case NeedsTableOwner:
		return head + fmt.Sprintf("only role %q, which owns %s (left by its Down, or by an Up that failed; with no schema fencelock it records nothing to keep), can mend this: run %s as that role, or let this role migrate once that role has dropped the table: %s",
			e.Only, e.Table, call, e.Fix)
	}
	return head + e.Fix.String()
}

func (e *MigrationErr) Unwrap() []error { return []error{guard.ErrPermission, e.err} }

// RowQuerier reads one row, as Driver.QueryRow does.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args []any, dest ...any) (found bool, err error)
}

// SQLQuerier is a RowQuerier over a database/sql handle.
type SQLQuerier struct {
	DB interface {
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	}
}

// QueryRow implements RowQuerier.
func (q SQLQuerier) QueryRow(ctx context.Context, query string, args []any, dest ...any) (bool, error) {
	err := q.DB.QueryRowContext(ctx, query, args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// tableOwnerSQL is the owner of the table $1 names (through the
// search_path, as goose finds its version table); no row without one.
const tableOwnerSQL = "SELECT pg_catalog.pg_get_userbyid(c.relowner)::pg_catalog.text FROM pg_catalog.pg_class c" +
	" WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1)"

// ExplainMigration words err, met by the migrations' op ("up", "down",
// "status") or a statement made for it, when it is a refusal (42501):
// after reading the session's role, the schema's owner and the version
// table's (on this failure path only), a *MigrationErr; an error already
// worded, or any other, is returned as it is.
func ExplainMigration(ctx context.Context, q RowQuerier, op, table string, err error) error {
	var me *MigrationErr
	if Code(err) != InsufficientPrivilege || errors.As(err, &me) {
		return err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), guard.RollbackTimeout)
	defer cancel()
	var s Schema
	if _, qerr := q.QueryRow(rctx, SchemaSQL, nil, s.Dest()...); qerr != nil {
		return err
	}
	var tableOwner string
	if _, qerr := q.QueryRow(rctx, tableOwnerSQL, []any{table}, &tableOwner); qerr != nil {
		return err
	}
	if me := migrationDenied(op, s, table, tableOwner, err); me != nil {
		return me
	}
	return err
}

// migrationDenied is the *MigrationErr of err, a refusal met by op as the
// session s describes, with the version table table owned by tableOwner
// ("" when there is none); nil when err is none of the MigrationCases.
func migrationDenied(op string, s Schema, table, tableOwner string, err error) *MigrationErr {
	e := &MigrationErr{Op: op, Role: s.User, Table: table, err: err}
	d, _ := ParseDenial(errMessage(err))
	role := QuoteIdent(s.User)
	owner, other := s.OtherOwner()
	privileges := "SELECT, INSERT, DELETE" // goose records and deletes versions
	if op == "status" {
		privileges = "SELECT"
	}
	switch {
	case op != "status" && other:
		// Whatever was refused (USAGE, a function, the version table):
		// only the owner may replace or drop what the schema holds.
		e.Case, e.Lacks, e.Only = NeedsOwner, "ownership of schema fencelock", owner
	case d.Kind == "table" && d.Object == table && s.Exists:
		e.Case, e.Lacks = NeedsTableGrant, privileges+" on table "+table
		e.Fix = &SQLFix{Who: "the table's owner", Database: s.Database, Stmts: []string{"GRANT " + privileges + " ON " + table + " TO " + role}}
		if tableOwner != "" {
			e.Fix.Who, e.Fix.Role = fmt.Sprintf("the table's owner (role %q)", tableOwner), tableOwner
		}
	case d.Kind == "table" && d.Object == table && tableOwner != "" && tableOwner != s.User:
		e.Case, e.Lacks, e.Only = NeedsTableOwner, privileges+" on table "+table, tableOwner
		e.Fix = &SQLFix{Who: fmt.Sprintf("that role (role %q)", tableOwner), Role: tableOwner, Database: s.Database,
			Stmts: []string{"DROP TABLE " + table}}
	case op != "down" && op != "status" && (d.Kind == "database" || d.Kind == "schema" && d.Object != "fencelock"):
		// goose creates its version table in the first schema of the
		// search_path, which the refusal names, then the schema: both
		// grants at once, so that one paste is enough.
		e.Case, e.Lacks = NeedsCreate, "CREATE on database "+strconv.Quote(s.Database)
		stmts := []string{"GRANT CREATE ON DATABASE " + QuoteIdent(s.Database) + " TO " + role}
		if d.Kind == "schema" {
			e.Lacks = "CREATE on schema " + d.Object
			stmts = append(stmts, "GRANT CREATE ON SCHEMA "+QuoteIdent(d.Object)+" TO "+role)
		}
		e.Fix = &SQLFix{Who: "an admin (a superuser, or the database's owner)", Database: s.Database, Stmts: stmts}
	default:
		return nil
	}
	return e
}
