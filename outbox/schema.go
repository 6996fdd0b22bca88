package outbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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

// grantError: the role may not execute an outbox function.
type grantError struct{ msg string }

func (e *grantError) Error() string { return e.msg }

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

// grantFix is the GRANT that lets s's role execute the fencelock
// functions, and who may run it.
func grantFix(s pgcore.Schema) string {
	return fmt.Sprintf("as %s, GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO %s", schemaOwner(s), pgx.Identifier{s.User}.Sanitize())
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
// this fencelock needs, or its outbox changed by hand), a *grantError, or
// the database's error (a connection that failed, ...) to wait through.
func checkSchema(ctx context.Context, db DB) error {
	s, err := readSchema(ctx, db)
	if err != nil {
		return err
	}
	if err := s.Err(pgcore.PgxTarget(db)); err != nil {
		return reprefix("outbox: ", err)
	}
	var exists, can bool
	rows, err := db.Query(ctx, `SELECT p IS NOT NULL, p IS NOT NULL AND pg_catalog.has_function_privilege(p, 'EXECUTE')
  FROM (SELECT pg_catalog.to_regprocedure('fencelock.outbox_claim(bigint, integer, interval, text)') p) f`, pgx.QueryExecModeExec)
	if err == nil {
		err = pgxRow{rows}.Scan(&exists, &can)
	}
	switch {
	case err != nil:
		return err
	case !exists:
		// The schema says it is current, yet its outbox is gone: not
		// something a migration fixes (Up has nothing to apply).
		return &prefixedError{msg: fmt.Sprintf("outbox: schema fencelock in database %q is at %s but has no function fencelock.outbox_claim (changed by hand): restore it as migrations/00003_outbox.sql defines it, as %s",
			s.Database, s.Have(), schemaOwner(s)), err: guard.ErrSchemaMissing}
	case !can:
		return &grantError{fmt.Sprintf("outbox: role %q may not execute the outbox functions: %s", s.User, grantFix(s))}
	}
	return nil
}

// addedBy is the migration that added an outbox function, for those that
// came after the outbox's (3).
var addedBy = map[string]int{"outbox_backlog": 5, "outbox_revive": 5}

var deniedFunction = regexp.MustCompile(`permission denied for function (\w+)`)

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
	case pgErr.Code == "42501":
		if m := deniedFunction.FindStringSubmatch(pgErr.Message); m != nil {
			added := 3
			if v, ok := addedBy[m[1]]; ok {
				added = v
			}
			return &grantError{fmt.Sprintf("%srole %q may not execute fencelock.%s (migration %d added it, and a grant on all functions covers only those that existed when it was made): %s",
				prefix, s.User, m[1], added, grantFix(s))}
		}
	}
	return fmt.Errorf("%s%w", prefix, describe(err))
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
