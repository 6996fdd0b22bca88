package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// VersionTable is the goose version table of the fencelock migrations. It is
// not goose's default ("goose_db_version") so that fencelock's versions never
// mix with the application's own goose migrations in the same database, and
// it lives outside the fencelock schema so that Down can drop the whole
// schema. With the goose CLI pass it as -table.
const VersionTable = "fencelock_db_version"

//go:embed *.sql
var files embed.FS

// FS returns the embedded SQL migration files (goose format, at the root).
func FS() fs.FS { return files }

// newProvider builds a goose provider (never Closed: that would close the
// caller's db) over the embedded files with
// Postgres's session-level advisory lock, so that two processes migrating
// at once take turns instead of colliding.
func newProvider(db *sql.DB) (*goose.Provider, error) {
	if db == nil {
		return nil, ErrNilDB
	}
	// Probe every second (goose's default is every 5 s) for up to 5 minutes.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("migrations: session locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS(),
		goose.WithSessionLocker(locker),
		goose.WithTableName(VersionTable),
		// Only the embedded files: Go migrations registered globally by the
		// application must not run here.
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Up applies every pending fencelock migration to db (a database/sql handle
// on Postgres, e.g. from github.com/jackc/pgx/v5/stdlib). ctx bounds the
// whole run, including the wait for another process's migration lock.
func Up(ctx context.Context, db *sql.DB) error {
	p, err := newProvider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P06" && strings.Contains(pgErr.Message, "fencelock") {
			// duplicate_schema: installed, but not recorded in our table.
			return fmt.Errorf("%w: %w", ErrUnrecorded, err)
		}
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// Down rolls back every fencelock migration: the fencelock schema and
// everything in it (tables, functions, and the protect triggers installed
// on user tables) are dropped. The version table stays, empty.
func Down(ctx context.Context, db *sql.DB) error {
	p, err := newProvider(db)
	if err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrations: down: %w", err)
	}
	return nil
}

// Status reports each fencelock migration and whether it is applied.
func Status(ctx context.Context, db *sql.DB) ([]*goose.MigrationStatus, error) {
	p, err := newProvider(db)
	if err != nil {
		return nil, err
	}
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	return st, nil
}
