package pgfence

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	// ErrBadTable is returned by Protect and Unprotect for a table name
	// that is not one or two plain identifiers.
	ErrBadTable = errors.New("pgfence: bad table name")

	// ErrNoTable is returned by Protect when the table does not exist.
	ErrNoTable = errors.New("pgfence: table does not exist")

	// errNilDB is New's error for a nil DB.
	errNilDB = fmt.Errorf("%w: pass a *pgxpool.Pool or *pgx.Conn", guard.ErrNilDB)

	// errUnexpected is a protocol answer pgfence did not expect.
	errUnexpected = errors.New("pgfence: unexpected answer from the server")
)

// mapError turns the errors raised by the fencelock SQL functions into
// guard's errors (internal/pgcore); everything that talks to the database
// passes its errors here.
func mapError(err error) error { return pgcore.Map(err) }

// MapError translates an error from raw SQL that called the fencelock
// functions (fencelock.claim, a protected table's trigger), through any
// Postgres driver (pgx, pgx's database/sql driver, lib/pq), into the
// errors of guard: FL001 becomes a *guard.StaleTokenError, FL002
// guard.ErrNotClaimed, and so on, the same values sqlfence returns. Other errors are returned unchanged.
func MapError(err error) error { return mapError(err) }

// isReadOnly reports whether err is Postgres refusing a write because the
// transaction is read-only.
func isReadOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25006"
}

// readOnlyError asks the server why it is read-only, to name the setting
// (on the failure path only: one more round trip).
func readOnlyError(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) error {
	var standby bool
	var def string
	err := q.QueryRow(ctx, "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('default_transaction_read_only')",
		pgx.QueryExecModeExec).Scan(&standby, &def)
	switch {
	case err != nil:
		return fmt.Errorf("%w (transaction_read_only is on): fn did not run, nothing was written", guard.ErrReadOnly)
	case standby:
		return fmt.Errorf("%w: the server is a hot standby (pg_is_in_recovery() is true): fn did not run, nothing was written; connect to the primary", guard.ErrReadOnly)
	case def == "on":
		return fmt.Errorf("%w: default_transaction_read_only is on (set for the database, the role or the session): fn did not run, nothing was written; turn it off or connect to a writable database", guard.ErrReadOnly)
	}
	return fmt.Errorf("%w (transaction_read_only is on): fn did not run, nothing was written", guard.ErrReadOnly)
}
