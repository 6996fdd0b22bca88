package pgfence

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
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
// guard.ErrNotClaimed, and so on, the same values sqlfence returns. Other
// errors are returned unchanged.
func MapError(err error) error { return mapError(err) }

// isReadOnly reports whether err is Postgres refusing a write because the
// transaction is read-only.
func isReadOnly(err error) bool { return pgcore.Code(err) == pgcore.ReadOnly }

// readOnlyError asks the server on q why it is read-only, to name the
// setting (on the failure path only: one more round trip).
func readOnlyError(ctx context.Context, q DB) error {
	c := pgcore.Core{Driver: driver{q}}
	return c.ExplainReadOnly(ctx)
}
