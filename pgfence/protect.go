package pgfence

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

// triggerName is the statement trigger Protect installs on a table.
const triggerName = "fencelock_protect"

// Protect installs a statement trigger on table that rejects INSERT,
// UPDATE, DELETE and TRUNCATE from any transaction that has not claimed a
// current fence: writes through guard.Exec pass, and so does raw SQL from
// any language that first calls
//
//	SELECT fencelock.claim(resource, token, holder);
//
// in the same transaction. A write without a claim fails with
// guard.ErrNotClaimed, one whose claim has since been overtaken by a newer token
// with a *guard.StaleTokenError. Calling it again is harmless.
//
// The trigger checks the claim under a lock on the fence row that lasts
// until the transaction ends (it claims the token itself when guard.Exec
// has only checked it so far), so writes to a protected table commit in
// token order whatever the writer does before COMMIT. The price: a holder
// frozen after writing to a protected table delays the next holder's
// claim until its transaction ends (see pgstore.WithIdleTimeout and
// pgstore.WithLockTimeout). Writes to unprotected tables through
// guard.Exec lock the fence row only while they commit.
//
// table is "name" or "schema.name", each part a plain identifier (letters,
// digits, _ and $, not starting with a digit, at most 63 bytes), matched
// exactly as written (it is quoted, so "Stock" is not "stock"). Anything
// else is ErrBadTable; a table that does not exist is ErrNoTable.
//
// With ForResource the claim must also be for that resource; without it a
// current claim on any resource is accepted.
func (s *Store) Protect(ctx context.Context, table string, opts ...ProtectOption) error {
	id, err := parseTable(table)
	if err != nil {
		return err
	}
	var cfg protectConfig
	for _, o := range opts {
		if o == nil {
			return fmt.Errorf("%w: nil ProtectOption", guard.ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return err
		}
	}
	if err := s.core.CheckSchema(ctx, "protect"); err != nil {
		return err
	}
	// DDL takes no parameters: the resource becomes a trigger argument
	// quoted by the server (format's %L), not by hand.
	ddl := "CREATE OR REPLACE TRIGGER " + triggerName +
		" BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON " + id.Sanitize() +
		" FOR EACH STATEMENT EXECUTE FUNCTION fencelock.protect_guard(%s)"
	if cfg.resource != "" {
		if err := s.db.QueryRow(ctx, "SELECT pg_catalog.format($1, pg_catalog.quote_literal($2::text))",
			pgx.QueryExecModeExec, ddl, cfg.resource).Scan(&ddl); err != nil {
			return mapError(s.core.ConnError("protect", err))
		}
	} else {
		ddl = strings.Replace(ddl, "%s", "", 1)
	}
	_, err = s.db.Exec(ctx, ddl)
	return tableError(table, s.core.ConnError("protect", err))
}

// ProtectOption configures Protect.
type ProtectOption interface {
	apply(*protectConfig) error
}

// protectOptionFunc is a ProtectOption as a function.
type protectOptionFunc func(*protectConfig) error

func (f protectOptionFunc) apply(c *protectConfig) error { return f(c) }

type protectConfig struct{ resource string }

// ForResource binds the protected table to one resource: a write is
// accepted only from a transaction whose current claim is for resource
// (the lock name that guards the table), so a holder of another lock cannot
// write to it. Calling Protect again replaces the binding.
func ForResource(resource string) ProtectOption {
	return protectOptionFunc(func(c *protectConfig) error {
		if resource == "" {
			return fmt.Errorf("%w: ForResource: empty resource name", guard.ErrInvalidOption)
		}
		if err := pgcore.CheckLen("resource name", resource, guard.MaxResourceLen, guard.ErrInvalidOption); err != nil {
			return err
		}
		if err := pgcore.CheckText("resource", resource); err != nil {
			return err
		}
		c.resource = resource
		return nil
	})
}

// Unprotect removes the trigger installed by Protect. Calling it on a
// table that is not protected, or does not exist, is harmless; a bad name
// is ErrBadTable.
func (s *Store) Unprotect(ctx context.Context, table string) error {
	id, err := parseTable(table)
	if err != nil {
		return err
	}
	_, err = s.db.Exec(ctx, "DROP TRIGGER IF EXISTS "+triggerName+" ON "+id.Sanitize())
	return tableError(table, s.core.ConnError("unprotect", err))
}

func tableError(table string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && !strings.Contains(pgErr.Message, "fencelock") &&
		(pgErr.Code == "42P01" || pgErr.Code == "3F000") {
		return fmt.Errorf("%w: %q (%s)", ErrNoTable, table, pgErr.Message)
	}
	return mapError(err)
}

// parseTable splits "name" or "schema.name" into identifiers and rejects
// anything that is not a plain identifier, so no SQL is ever built from
// unchecked input (and the parts are quoted as well).
func parseTable(table string) (pgx.Identifier, error) {
	if table == "" {
		return nil, fmt.Errorf("%w: empty: pass a table name such as \"stock\" or \"public.stock\"", ErrBadTable)
	}
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%w: %q: at most schema.table", ErrBadTable, table)
	}
	for _, p := range parts {
		if err := checkIdent(p); err != nil {
			return nil, fmt.Errorf("%w: %q: %s", ErrBadTable, table, err)
		}
	}
	return pgx.Identifier(parts), nil
}

func checkIdent(p string) error {
	if p == "" {
		return errors.New("empty identifier")
	}
	if len(p) > 63 {
		return fmt.Errorf("identifier %.20q... longer than 63 bytes", p)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		case (c >= '0' && c <= '9' || c == '$') && i > 0:
		default:
			return fmt.Errorf("character %q at byte %d is not allowed (letters, digits, _ and $ only, not starting with a digit)", c, i)
		}
	}
	return nil
}
