package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/internal/pgcore"
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

// ErrNotOwner is what a *NotOwnerError matches with errors.Is.
var ErrNotOwner = errors.New("migrations: up: only the owner of schema fencelock may migrate it")

// NotOwnerError is returned by Up run as a role that does not have the
// rights of schema fencelock's owner (an application role: USAGE and
// EXECUTE only) while migrations are pending: only the owner may replace
// the schema's functions. Up changed nothing. (With the schema current,
// Up as such a role does nothing and returns nil.)
type NotOwnerError struct {
	// Role is the session's role; Owner the schema's.
	Role, Owner string
	// Version is the version the schema implements (0: older than
	// schema_version()); Last the newest of these migrations.
	Version, Last int64
	// Fix is how to migrate it, as the owner.
	Fix string
}

func (e *NotOwnerError) Error() string {
	have := fmt.Sprintf("version %d of %d installed", e.Version, e.Last)
	if e.Version == 0 {
		have = fmt.Sprintf("a version older than 3 installed, of %d", e.Last)
	}
	return fmt.Sprintf("migrations: up: role %q cannot migrate schema fencelock (%s): only its owner, role %q, may: %s", e.Role, have, e.Owner, e.Fix)
}

// Unwrap returns ErrNotOwner.
func (e *NotOwnerError) Unwrap() error { return ErrNotOwner }

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

// connError rewrites err in one line when a connection to Postgres failed
// under it, as the stores do; any other error is returned as it is.
func connError(op string, err error) error { return pgcore.ConnError("migrations", op, err) }

// permissionError words a refusal (SQLSTATE 42501) of op as every
// fencelock call words one (pgcore's one mapping): the role, what it
// lacks on which object, and the SQL that mends it, whom to run it as and
// in which database, or the one role that may migrate. Any other error is
// returned as it is.
func permissionError(ctx context.Context, db *sql.DB, op string, err error) error {
	if db == nil || err == nil {
		return err
	}
	return pgcore.ExplainMigration(ctx, pgcore.SQLQuerier{DB: db}, op, VersionTable, err)
}
