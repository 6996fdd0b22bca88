package migrations

import (
	"errors"
	"strings"
)

// ErrNilDB is returned by Up, Down and Status when db is nil.
var ErrNilDB = errors.New("migrations: nil *sql.DB: open one with sql.Open(\"pgx\", url) or stdlib.OpenDBFromPool(pool)")

// ErrInvalidOption is returned by Up, Down and Status for a bad option (a
// nil one, Force outside Down, WithLogger(nil)).
var ErrInvalidOption = errors.New("migrations: invalid option")

// ErrUnrecorded is returned by Up and Status when the fencelock schema
// exists, VersionTable does not record it, and it is not exactly what the
// migrations create (so Up cannot adopt it, see Up). The error says what
// differs and how to start over.
var ErrUnrecorded = errors.New("migrations: schema fencelock exists but is not recorded in " + VersionTable)

// ErrRecordedMissing is returned by Up and Status when VersionTable
// records fencelock migrations but the fencelock schema does not exist
// (dropped by hand): goose would consider it installed. The error gives the
// statement that clears the records.
var ErrRecordedMissing = errors.New("migrations: schema fencelock does not exist but " + VersionTable + " records it as installed")

// ErrProtected is what a *ProtectedError matches with errors.Is.
var ErrProtected = errors.New("migrations: down: tables are still protected by pgfence's Protect")

// ProtectedError is returned by Down when tables protected by pgfence's
// Protect still have their trigger: dropping the schema would silently
// leave them unfenced. Unprotect them (pgfence Store.Unprotect, or DROP
// TRIGGER fencelock_protect ON table), or pass Force.
type ProtectedError struct {
	// Tables are the protected tables, schema-qualified.
	Tables []string
}

func (e *ProtectedError) Error() string {
	return ErrProtected.Error() + ": " + strings.Join(e.Tables, ", ") +
		": unprotect them first (Store.Unprotect), or call Down(ctx, db, migrations.Force()) to drop their triggers with the schema"
}

// Unwrap returns ErrProtected.
func (e *ProtectedError) Unwrap() error { return ErrProtected }
