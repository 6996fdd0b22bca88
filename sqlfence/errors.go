package sqlfence

import (
	"fmt"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
)

// errNilDB is New's error for a nil *sql.DB.
var errNilDB = fmt.Errorf("%w: pass the *sql.DB of a Postgres driver (pgx's stdlib, lib/pq)", guard.ErrNilDB)

// mapError turns the errors raised by the fencelock SQL functions into
// guard's errors (internal/pgcore).
func mapError(err error) error { return pgcore.Map(err) }

// MapError translates an error from raw SQL that called the fencelock
// functions (fencelock.claim, a protected table's trigger), through any
// Postgres driver, into the errors of guard, the same values pgfence
// returns: FL001 becomes a *guard.StaleTokenError, FL003 an error wrapping
// guard.ErrAlreadyApplied, FL002 guard.ErrNotClaimed, FL004
// guard.ErrRunFinished, 25006 guard.ErrReadOnly. Other errors are returned
// unchanged.
func MapError(err error) error { return mapError(err) }
