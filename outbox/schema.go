package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// How the outbox finds out, and says, that a database cannot serve it: the
// schema and the role's grants are read from the catalog (pgcore.SchemaSQL,
// to_regprocedure), which needs no privilege and raises nothing when
// something is missing, so each cause gets its own message and fix.

// prefixedError is err, an error of the schema check (whose message starts
// with guard's prefix), under the outbox's prefix instead: one prefix per
// layer. It matches what err matches (guard.ErrSchemaMissing,
// guard.ErrSchemaOutdated).
type prefixedError struct {
	msg string
	err error
}

func (e *prefixedError) Error() string { return e.msg }
func (e *prefixedError) Unwrap() error { return e.err }

func reprefix(prefix string, err error) error {
	return &prefixedError{msg: prefix + strings.TrimPrefix(err.Error(), "guard: "), err: err}
}

// readSchema reads the schema's state from the catalog.
func readSchema(ctx context.Context, db DB) (pgcore.Schema, error) {
	var s pgcore.Schema
	rows, err := db.Query(ctx, pgcore.SchemaSQL, pgx.QueryExecModeExec)
	if err != nil {
		return s, err
	}
	return s, pgxRow{rows}.Scan(s.Dest()...)
}

// schemaOwner names the schema's owner, as a message says it.
func schemaOwner(s pgcore.Schema) string {
	if s.Owner.Valid {
		return fmt.Sprintf("the schema's owner, role %q", s.Owner.String)
	}
	return "the schema's owner"
}

// checkSchema is a relay's look at the database before it runs: nil, an
// error matching guard.ErrSchemaMissing (the schema missing or older than
// this fencelock needs, or its outbox changed by hand), one matching
// guard.ErrPermission (the role lacks USAGE on the schema or EXECUTE on
// the outbox's functions), or the database's error (a connection that
// failed, ...) to wait through. Everything is read from the catalog,
// which needs no privilege: to_regprocedure would raise a refusal of its
// own for a role without USAGE.
func checkSchema(ctx context.Context, db DB) error {
	s, err := readSchema(ctx, db)
	if err != nil {
		return err
	}
	if err := s.Err(pgcore.PgxTarget(db)); err != nil {
		return reprefix("outbox: ", err)
	}
	var usage, exists, can bool
	rows, err := db.Query(ctx, `SELECT pg_catalog.has_schema_privilege(n.oid, 'USAGE'), p.oid IS NOT NULL,
  p.oid IS NOT NULL AND pg_catalog.has_function_privilege(p.oid, 'EXECUTE')
  FROM pg_catalog.pg_namespace n LEFT JOIN pg_catalog.pg_proc p ON p.pronamespace OPERATOR(pg_catalog.=) n.oid
   AND p.proname OPERATOR(pg_catalog.=) 'outbox_claim'
  WHERE n.nspname OPERATOR(pg_catalog.=) 'fencelock' LIMIT 1`, pgx.QueryExecModeExec)
	if err == nil {
		err = pgxRow{rows}.Scan(&usage, &exists, &can)
	}
	grants := pgcore.AppGrants(s.User, s.Owner.String)
	switch {
	case err != nil:
		return err
	case !exists:
		// The schema says it is current, yet its outbox is gone: not
		// something a migration fixes (Up has nothing to apply).
		return &prefixedError{msg: fmt.Sprintf("outbox: schema fencelock in database %q is at %s but has no function fencelock.outbox_claim (changed by hand): restore it as migrations/00003_outbox.sql defines it, as %s",
			s.Database, s.Have(), schemaOwner(s)), err: guard.ErrSchemaMissing}
	case !usage:
		return pgcore.Lacks("outbox: relay: ", s, "USAGE on schema fencelock", "it cannot run", grants, nil)
	case !can:
		return pgcore.Lacks("outbox: relay: ", s, "EXECUTE on the outbox's functions (fencelock.outbox_claim and others)", "it cannot run", grants[1:], nil)
	}
	return nil
}

// opError words an error of an operator's call (List, Count, Backlog,
// Requeue) as "outbox: <op>: ...": a schema missing or older than this
// fencelock needs as the stores word it (matching guard.ErrSchemaMissing,
// with the command that migrates it), a role that may not execute the
// function with the GRANT to repeat, both read from the catalog; any
// other error as the relay describes it.
func opError(ctx context.Context, db DB, op string, err error) error {
	prefix := "outbox: " + op + ": "
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("%s%w", prefix, err)
	}
	switch pgErr.Code {
	case "3F000", "42883", "42P01", "42501":
	default:
		return fmt.Errorf("%s%w", prefix, describe(err))
	}
	s, serr := readSchema(ctx, db)
	switch {
	case serr != nil:
	case s.Err(pgcore.PgxTarget(db)) != nil:
		return reprefix(prefix, s.Err(pgcore.PgxTarget(db)))
	case pgErr.Code == pgcore.InsufficientPrivilege:
		// The operators' calls run fencelock's functions only.
		if perr := pgcore.PermissionError(prefix, s, true, err); perr != err {
			return perr
		}
	}
	return fmt.Errorf("%s%w", prefix, describe(err))
}

// relayDenied words err, a refusal (42501) that the relay's loop met
// while it could not do what doing says ("claim"), as at start-up: the
// role, what it lacks and the GRANT the owner runs, read from the catalog
// (on this failure path only); any other error, or one the catalog
// cannot explain, is returned as it is.
func relayDenied(ctx context.Context, db DB, doing string, err error) error {
	if pgcore.Code(err) != pgcore.InsufficientPrivilege {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	s, serr := readSchema(ctx, db)
	if serr != nil {
		return err
	}
	// The relay runs fencelock's functions only.
	return pgcore.RefusalError("outbox: relay: ", "it cannot "+doing+": effects wait in the outbox, and the relay polls until the grant is back", s, true, err)
}

// describe names what an error from the database means for the outbox. A
// missing object, once the schema was found current (Run checks it
// first, the operators' calls on such an error), is the schema changed
// while in use: migrated down, or by hand.
func describe(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "3F000", "42883", "42P01":
			return fmt.Errorf("the fencelock schema lacks what the outbox needs (migrated down, or changed by hand, while in use?): migrate it up again (migrations.Up(ctx, db), or fencectl migrate up), or, at the current version, restore it as the migrations define it: %w", err)
		case "25006":
			return fmt.Errorf("the database is read-only (a standby, or default_transaction_read_only): nothing can be claimed until it is writable: %w", err)
		}
	}
	return err
}
