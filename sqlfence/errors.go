package sqlfence

import (
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/sqlstate"
)

// MigrateCommand is the goose CLI command that installs the fencelock
// schema; errors about a missing schema name it.
const MigrateCommand = `goose -dir migrations -table fencelock_db_version postgres "$DATABASE_URL" up`

var (
	// ErrSchemaMissing is returned by every call when the fencelock schema
	// (tables and functions) is not installed in the database.
	ErrSchemaMissing = errors.New("sqlfence: fencelock schema not installed: run migrations.Up(ctx, db), or: " + MigrateCommand)

	// ErrReadOnly is returned by Exec (through the Store), Advance and
	// Run's methods when the database does not accept writes: the
	// transaction is read-only because of default_transaction_read_only
	// (set on the database, the role or the session) or because the server
	// is a hot standby. fn did not run and nothing was written; the
	// message names the setting.
	ErrReadOnly = errors.New("sqlfence: the database is read-only")

	// ErrNotClaimed is returned when a write to a table protected with
	// pgfence's Protect comes from a transaction that has neither claimed
	// nor checked a fence.
	ErrNotClaimed = errors.New("sqlfence: write to a protected table without a fence claim")

	// ErrRunFinished is returned by Run.Step when the run was finished (by
	// this or an earlier holder): fn did not run, nothing was written. It
	// wraps guard.ErrAlreadyApplied.
	ErrRunFinished = fmt.Errorf("sqlfence: run already finished: %w", guard.ErrAlreadyApplied)

	// ErrFenceBusy is returned (with WithLockTimeout) when a lock the
	// transaction waited for, such as the fence row held by a holder paused
	// after writing to a protected table, stayed taken past the timeout.
	ErrFenceBusy = errors.New("sqlfence: fence row locked by another transaction beyond the lock timeout")

	// ErrInvalidInput is returned for an empty run key, a negative Prune
	// age, a NUL byte or invalid UTF-8 in a string, a string over its
	// length limit, and similar bad input; nothing is written.
	ErrInvalidInput = errors.New("sqlfence: invalid input")

	// ErrNilDB is returned by New for a nil *sql.DB.
	ErrNilDB = errors.New("sqlfence: nil DB: pass the *sql.DB of a Postgres driver (pgx's stdlib, lib/pq)")

	// ErrInvalidOption is returned by New for a bad option.
	ErrInvalidOption = errors.New("sqlfence: invalid option")
)

var mapper = sqlstate.Mapper{
	SchemaMissing: ErrSchemaMissing,
	NotClaimed:    ErrNotClaimed,
	RunFinished:   ErrRunFinished,
	FenceBusy:     ErrFenceBusy,
	InvalidInput:  ErrInvalidInput,
	ReadOnly:      ErrReadOnly,
}

func mapError(err error) error { return mapper.Map(err) }

// MapError translates an error from raw SQL that called the fencelock
// functions (fencelock.claim, a protected table's trigger), through any
// Postgres driver, into the errors of guard and sqlfence: FL001 becomes a
// *guard.StaleTokenError, FL003 an error wrapping guard.ErrAlreadyApplied,
// FL002 ErrNotClaimed, FL004 ErrRunFinished, 25006 ErrReadOnly. Other
// errors are returned unchanged.
func MapError(err error) error { return mapError(err) }

// MapError is MapError as a method, so that guard.Exec translates the
// errors fn returns (guard.ErrorMapper).
func (s *Store) MapError(err error) error { return mapError(err) }
