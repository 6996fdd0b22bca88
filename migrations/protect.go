package migrations

import (
	"context"
	"database/sql"
	"fmt"
)

// protectTrigger is a trigger on a user table that calls a fencelock
// function: what pgfence's Protect installs.
type protectTrigger struct {
	table   string // schema.name, quoted where needed
	trigger string // quoted trigger name
}

// protectTriggers lists the triggers on user tables that use a function of
// the fencelock schema (the schema's own outbox table has one too, dropped
// with it). None when the schema is not installed.
func protectTriggers(ctx context.Context, db *sql.DB) ([]protectTrigger, error) {
	rows, err := db.QueryContext(ctx, `
SELECT format('%I.%I', tn.nspname, c.relname), quote_ident(t.tgname)
  FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace tn ON tn.oid = c.relnamespace
  JOIN pg_proc p ON p.oid = t.tgfoid
  JOIN pg_namespace pn ON pn.oid = p.pronamespace
 WHERE pn.nspname = 'fencelock' AND tn.nspname <> 'fencelock' AND NOT t.tgisinternal
 ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("migrations: down: list protected tables: %w", err)
	}
	defer rows.Close()
	var out []protectTrigger
	for rows.Next() {
		var t protectTrigger
		if err := rows.Scan(&t.table, &t.trigger); err != nil {
			return nil, fmt.Errorf("migrations: down: list protected tables: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrations: down: list protected tables: %w", err)
	}
	return out, nil
}

// dropTriggers drops the protect triggers in one transaction (Force).
func dropTriggers(ctx context.Context, db *sql.DB, triggers []protectTrigger) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrations: down: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, t := range triggers {
		// Both names come quoted from the catalog (format %I, quote_ident).
		if _, err := tx.ExecContext(ctx, "DROP TRIGGER "+t.trigger+" ON "+t.table); err != nil {
			return fmt.Errorf("migrations: down: drop trigger %s on %s: %w", t.trigger, t.table, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrations: down: %w", err)
	}
	return nil
}
