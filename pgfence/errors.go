package pgfence

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/sqlstate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// MigrateCommand is the goose CLI command that installs the fencelock
// schema; errors about a missing schema name it.
const MigrateCommand = `goose -dir migrations -table fencelock_db_version postgres "$DATABASE_URL" up`

var (
	// ErrSchemaMissing is returned by every call when the fencelock schema
	// (tables and functions) is not installed in the database.
	ErrSchemaMissing = errors.New("pgfence: fencelock schema not installed: run migrations.Up(ctx, db), or: " + MigrateCommand)

	// ErrNotClaimed is returned when a write to a table protected with
	// Protect comes from a transaction that has neither claimed nor
	// checked a fence (call fencelock.claim(resource, token, holder) first,
	// or write through guard.Exec).
	ErrNotClaimed = errors.New("pgfence: write to a protected table without a fence claim")

	// ErrRunFinished is returned by Run.Step when the run was finished
	// (by this or an earlier holder): fn did not run, nothing was written.
	// It wraps guard.ErrAlreadyApplied.
	ErrRunFinished = fmt.Errorf("pgfence: run already finished: %w", guard.ErrAlreadyApplied)

	// ErrFenceBusy is returned (with WithLockTimeout) when the fence row
	// stayed locked by another open transaction longer than the lock
	// timeout: typically a previous holder paused after writing to a table
	// protected with Protect (a guarded transaction otherwise locks the row
	// only while it commits).
	ErrFenceBusy = errors.New("pgfence: fence row locked by another transaction beyond the lock timeout")

	// ErrBadTable is returned by Protect and Unprotect for a table name
	// that is not one or two plain identifiers.
	ErrBadTable = errors.New("pgfence: bad table name")

	// ErrNoTable is returned by Protect when the table does not exist.
	ErrNoTable = errors.New("pgfence: table does not exist")

	// ErrInvalidInput is returned for an empty run key, a negative Prune
	// age, a NUL byte or invalid UTF-8 in a string, and similar bad input;
	// nothing is written.
	ErrInvalidInput = errors.New("pgfence: invalid input")

	// ErrNilDB is returned by New for a nil DB.
	ErrNilDB = errors.New("pgfence: nil DB: pass a *pgxpool.Pool or *pgx.Conn")

	// ErrInvalidOption is returned by New for a bad option.
	ErrInvalidOption = errors.New("pgfence: invalid option")

	// ErrReadOnly is returned by guard.Exec, Run.Step, Run.Finish,
	// Advance and Prune when the database refuses writes: a read-only
	// default (default_transaction_read_only, for the database, the role
	// or the session) or a hot standby. The message names which. fn did
	// not run and nothing was written; pgfence never overrides the
	// setting.
	ErrReadOnly = errors.New("pgfence: the database is read-only")

	// errUnexpected is a protocol answer pgfence did not expect.
	errUnexpected = errors.New("pgfence: unexpected answer from the server")
)

// mapper maps the fencelock SQLSTATEs to guard's errors and this
// package's, for pgx's error type and any other driver's alike (package
// internal/sqlstate, shared with sqlfence: the one place that knows the
// codes).
var mapper = sqlstate.Mapper{
	SchemaMissing: ErrSchemaMissing,
	NotClaimed:    ErrNotClaimed,
	RunFinished:   ErrRunFinished,
	FenceBusy:     ErrFenceBusy,
	InvalidInput:  ErrInvalidInput,
	ReadOnly:      ErrReadOnly,
}

// mapError turns the errors raised by the fencelock SQL functions into the
// errors of guard and pgfence; everything that talks to the database
// passes its errors here.
func mapError(err error) error { return mapper.Map(err) }

// MapError translates an error from raw SQL that called the fencelock
// functions (fencelock.claim, a protected table's trigger), through any
// Postgres driver (pgx, pgx's database/sql driver, lib/pq), into the
// errors of guard and pgfence: FL001 becomes a *guard.StaleTokenError,
// FL002 ErrNotClaimed, and so on. Other errors are returned unchanged.
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
		return fmt.Errorf("%w (transaction_read_only is on): fn did not run, nothing was written", ErrReadOnly)
	case standby:
		return fmt.Errorf("%w: the server is a hot standby (pg_is_in_recovery() is true): fn did not run, nothing was written; connect to the primary", ErrReadOnly)
	case def == "on":
		return fmt.Errorf("%w: default_transaction_read_only is on (set for the database, the role or the session): fn did not run, nothing was written; turn it off or connect to a writable database", ErrReadOnly)
	}
	return fmt.Errorf("%w (transaction_read_only is on): fn did not run, nothing was written", ErrReadOnly)
}
