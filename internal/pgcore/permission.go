package pgcore

import (
	"context"
	"fmt"
	"regexp"
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
// denied for table outbox".
var deniedObject = regexp.MustCompile(`permission denied for (schema|function|procedure|table|relation|sequence) "?([^"\s]+)"?`)

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

// ExplainPermission is MapError for a refusal (42501): when it concerns
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
	return Lacks(prefix, s, lacks, "nothing was written", grants, err)
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
func OwnerFix(s Schema, grants []string) string {
	who, user := "the schema's owner", ""
	if s.Owner.Valid && s.Owner.String != "" {
		who = fmt.Sprintf("the schema's owner (role %q)", s.Owner.String)
		user = " -U " + ShellQuote(s.Owner.String)
	}
	return fmt.Sprintf("as %s, run in database %q: psql%s -d %s -c %s", who, s.Database, user,
		ShellQuote(s.Database), ShellQuote(strings.Join(grants, "; ")+";"))
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
