package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
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

// newLocker is goose's Postgres session advisory lock, probed every second
// (goose's default is every 5 s) for up to 5 minutes.
func newLocker() (lock.SessionLocker, error) {
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("migrations: session locker: %w", err)
	}
	return locker, nil
}

// newProvider builds a goose provider (never Closed: that would close the
// caller's db) over the embedded files with
// Postgres's session-level advisory lock, so that two processes migrating
// at once take turns instead of colliding. goose logs to logger at Debug.
func newProvider(db *sql.DB, logger *slog.Logger) (*goose.Provider, error) {
	if db == nil {
		return nil, ErrNilDB
	}
	locker, err := newLocker()
	if err != nil {
		return nil, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS(),
		goose.WithSessionLocker(locker),
		goose.WithTableName(VersionTable),
		// Only the embedded files: Go migrations registered globally by the
		// application must not run here.
		goose.WithDisableGlobalRegistry(true),
		goose.WithVerbose(true),
		goose.WithSlog(slog.New(debugHandler{logger.Handler()})),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

func setup(db *sql.DB, op string, opts []Option) (*goose.Provider, *config, error) {
	if db == nil {
		return nil, nil, ErrNilDB
	}
	cfg, err := newConfig(op, opts)
	if err != nil {
		return nil, nil, err
	}
	p, err := newProvider(db, cfg.logger)
	if err != nil {
		return nil, nil, err
	}
	return p, cfg, nil
}

// Up applies every pending fencelock migration to db (a database/sql handle
// on Postgres, e.g. from github.com/jackc/pgx/v5/stdlib). ctx bounds the
// whole run, including the wait for another process's migration lock.
//
// A fencelock schema that exists without a record in VersionTable (the
// goose CLI run without -table fencelock_db_version records it in
// goose_db_version instead) is adopted when it implements one of these
// migrations: every migration redefines fencelock.schema_version() to
// return its version (its Down restores the previous one), so a schema
// that says k is what migrations 1..k create. Up records those versions,
// logs that it did (see WithLogger), and applies the rest. A schema without
// that function, or with a version these migrations do not have, is
// ErrUnrecorded, with the fix.
//
// Run as a role without the rights of the schema's owner (an application
// role with USAGE and EXECUTE only, when every instance runs Up at
// start-up), Up reads the schema's version from the catalog instead of
// VersionTable, which that role may not read: it returns nil when the
// schema implements the last of these migrations (or a newer one), and a
// *NotOwnerError naming the versions and the owner when one is pending,
// changing nothing. It takes the migration lock first, so it waits for an
// owner's Up in progress and sees its result.
func Up(ctx context.Context, db *sql.DB, opts ...Option) (err error) {
	defer func() { err = connError("up", permissionError(ctx, db, "up", err)) }()
	p, cfg, err := setup(db, "up", opts)
	if err != nil {
		return err
	}
	if done, err := adopt(ctx, db, p.ListSources(), cfg); done || err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P06" && strings.Contains(pgErr.Message, "fencelock") {
			// duplicate_schema: installed in between, by something that
			// did not take the migration lock.
			return fmt.Errorf("%w: it appeared while Up ran; run Up again: %w", ErrUnrecorded, err)
		}
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// Down rolls back every fencelock migration: the fencelock schema and
// everything in it (tables with the stored tokens, functions) are dropped.
// The version table stays, empty.
//
// While tables protected by pgfence's Protect still have their trigger,
// Down refuses with a *ProtectedError naming them (unprotect them first),
// unless Force is given: then it drops those triggers too.
func Down(ctx context.Context, db *sql.DB, opts ...Option) (err error) {
	defer func() { err = connError("down", permissionError(ctx, db, "down", err)) }()
	p, cfg, err := setup(db, "down", opts)
	if err != nil {
		return err
	}
	triggers, err := protectTriggers(ctx, db)
	if err != nil {
		return err
	}
	if len(triggers) > 0 {
		if !cfg.force {
			tables := make([]string, len(triggers))
			for i, t := range triggers {
				tables[i] = t.table
			}
			return &ProtectedError{Tables: tables}
		}
		if err := dropTriggers(ctx, db, triggers); err != nil {
			return err
		}
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrations: down: %w", err)
	}
	return nil
}

// Status reports each fencelock migration and whether it is applied. A
// schema that Up would adopt (see Up) is reported applied, with the time
// goose_db_version recorded, if it did; a schema Up would refuse is
// ErrUnrecorded.
func Status(ctx context.Context, db *sql.DB, opts ...Option) (st []*goose.MigrationStatus, err error) {
	defer func() { err = connError("status", permissionError(ctx, db, "status", err)) }()
	p, _, err := setup(db, "status", opts)
	if err != nil {
		return nil, err
	}
	u, err := inspect(ctx, db, p.ListSources())
	if err != nil {
		return nil, err
	}
	if u != nil && u.adopt == nil {
		return nil, u.err()
	}
	if u != nil {
		for _, src := range p.ListSources() {
			s := &goose.MigrationStatus{Source: src, State: goose.StatePending}
			if src.Version <= u.version {
				s.State, s.AppliedAt = goose.StateApplied, u.legacy[src.Version]
			}
			st = append(st, s)
		}
		return st, nil
	}
	st, err = p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	return st, nil
}
