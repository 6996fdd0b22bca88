package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
)

// A schema installed without a record in VersionTable (the goose CLI run
// without -table fencelock_db_version records it in goose_db_version) is
// invisible to goose: it reports every migration pending, and applying
// 00001 fails on CREATE SCHEMA. The schema says itself which migration it
// implements: fencelock.schema_version(), which every migration redefines
// and every Down restores. Up records versions 1..k of a schema that says
// k (adopts it) and Status reports them applied; anything else is one
// error with a fix that works as written.

// installed reads whether the fencelock schema exists, whether it holds
// anything, and the version it implements (0 without schema_version()),
// from the catalog (pgcore.SchemaVersionSQL: no EXECUTE needed).
func installed(ctx context.Context, q database.DBTxConn) (exists, empty bool, version int64, err error) {
	var v sql.NullInt64
	err = q.QueryRowContext(ctx, `
SELECT n.oid IS NOT NULL,
       NOT EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = n.oid)
         AND NOT EXISTS (SELECT 1 FROM pg_proc WHERE pronamespace = n.oid),
       `+pgcore.SchemaVersionSQL+`
  FROM (SELECT to_regnamespace('fencelock') AS oid) n`).Scan(&exists, &empty, &v)
	version = v.Int64
	if err != nil {
		return false, false, 0, fmt.Errorf("migrations: inspect schema fencelock: %w", err)
	}
	return exists, empty, version, nil
}

// appliedVersions returns the versions a goose version table records as
// applied (its newest row per version decides), with when. Version 0,
// goose's marker row, is left out; a missing table records nothing.
func appliedVersions(ctx context.Context, q database.DBTxConn, table string) (map[int64]time.Time, bool, error) {
	store, err := database.NewStore(database.DialectPostgres, table)
	if err != nil {
		return nil, false, err
	}
	ext, ok := store.(database.StoreExtender)
	if !ok {
		return nil, false, errors.New("migrations: goose's Postgres store cannot check for a table")
	}
	exists, err := ext.TableExists(ctx, q)
	if err != nil || !exists {
		return nil, false, err
	}
	list, err := store.ListMigrations(ctx, q) // newest row first
	if err != nil {
		return nil, true, fmt.Errorf("migrations: read %s: %w", table, err)
	}
	applied := map[int64]time.Time{}
	seen := map[int64]bool{}
	for _, m := range list {
		if !seen[m.Version] && m.IsApplied && m.Version > 0 {
			applied[m.Version] = time.Time{}
			if r, err := store.GetMigration(ctx, q, m.Version); err == nil {
				applied[m.Version] = r.Timestamp
			}
		}
		seen[m.Version] = true
	}
	return applied, true, nil
}

// unrecorded is a schema VersionTable does not record.
type unrecorded struct {
	version int64               // what schema_version() says, 0 without it
	empty   bool                // the schema holds nothing
	adopt   []int64             // versions 1..version, nil if these migrations lack one
	last    int64               // the newest version these migrations have
	legacy  map[int64]time.Time // what goose_db_version records of ours
}

// inspect compares the database with VersionTable. It returns nil when
// there is nothing unusual: the schema is absent and unrecorded (Up
// installs it) or present and recorded (goose knows it). Otherwise the
// schema exists without a record (adoptable or not), or the record exists
// without a schema (an error).
func inspect(ctx context.Context, q database.DBTxConn, sources []*goose.Source) (*unrecorded, error) {
	ours, _, err := appliedVersions(ctx, q, VersionTable)
	if err != nil {
		return nil, err
	}
	exists, empty, version, err := installed(ctx, q)
	switch {
	case err != nil:
		return nil, err
	case !exists && len(ours) == 0, exists && len(ours) > 0:
		return nil, nil
	case !exists:
		return nil, fmt.Errorf("%w: %s records versions %s: delete the records (DELETE FROM %s WHERE version_id > 0) and run Up again",
			ErrRecordedMissing, VersionTable, versionList(ours), VersionTable)
	}
	u := &unrecorded{version: version, empty: empty, legacy: map[int64]time.Time{}}
	known := map[int64]bool{}
	for _, s := range sources {
		known[s.Version] = true
		u.last = max(u.last, s.Version)
	}
	if legacy, _, err := appliedVersions(ctx, q, goose.DefaultTablename); err == nil {
		for v, at := range legacy {
			if known[v] {
				u.legacy[v] = at
			}
		}
	}
	if known[version] {
		for _, s := range sources {
			if s.Version <= version {
				u.adopt = append(u.adopt, s.Version)
			}
		}
	}
	return u, nil
}

func versionList(m map[int64]time.Time) string {
	var s []string
	for _, v := range slices.Sorted(maps.Keys(m)) {
		s = append(s, strconv.FormatInt(v, 10))
	}
	return strings.Join(s, ", ")
}

// err is the error for a schema that cannot be adopted.
func (u *unrecorded) err() error {
	var why string
	switch {
	case u.empty:
		why = "it holds none of fencelock's tables or functions"
	case u.version == 0:
		why = "it has no function fencelock.schema_version(), so it was made by hand or by an older fencelock"
	default:
		why = fmt.Sprintf("fencelock.schema_version() says it implements version %d, and these migrations go to %d: it was installed by a newer fencelock, "+
			"which can upgrade it", u.version, u.last)
	}
	return fmt.Errorf("%w, and it does not match these migrations (%s); "+
		"drop it (DROP SCHEMA fencelock CASCADE; this also drops the stored tokens and the Protect triggers) and run Up again, with no fenced writer running in between",
		ErrUnrecorded, why)
}

// record writes versions into VersionTable (creating it as goose does) in
// one transaction.
func record(ctx context.Context, db *sql.Conn, versions []int64) error {
	store, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	_, exists, err := appliedVersions(ctx, tx, VersionTable)
	if err != nil {
		return err
	}
	if !exists {
		if err := store.CreateVersionTable(ctx, tx); err != nil {
			return err
		}
		versions = append([]int64{0}, versions...) // goose's marker row
	}
	for _, v := range versions {
		if err := store.Insert(ctx, tx, database.InsertRequest{Version: v}); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// adopt records a matching unrecorded schema in VersionTable, under the
// migration lock so that concurrent Ups do not record it twice. done: Up
// has nothing more to do (see notOwner).
func adopt(ctx context.Context, db *sql.DB, sources []*goose.Source, cfg *config) (done bool, err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: up: %w", err)
	}
	defer conn.Close()
	locker, err := newLocker()
	if err != nil {
		return false, err
	}
	if err := locker.SessionLock(ctx, conn); err != nil {
		return false, fmt.Errorf("migrations: up: lock: %w", err)
	}
	defer func() { _ = locker.SessionUnlock(context.WithoutCancel(ctx), conn) }()

	if done, err := notOwner(ctx, conn, sources); done || err != nil {
		return done, err
	}
	u, err := inspect(ctx, conn, sources)
	if err != nil || u == nil {
		return false, err
	}
	if u.adopt == nil {
		return false, u.err()
	}
	if err := record(ctx, conn, u.adopt); err != nil {
		return false, fmt.Errorf("migrations: up: record the existing schema in %s: %w", VersionTable, err)
	}
	from := "no version table records it"
	if len(u.legacy) > 0 {
		from = fmt.Sprintf("%s records versions %s: the goose CLI was probably run without -table %s; those rows are left as they are",
			goose.DefaultTablename, versionList(u.legacy), VersionTable)
	}
	cfg.logger.InfoContext(ctx, fmt.Sprintf("migrations: schema fencelock was installed without a record in %s (%s); it matches migrations 1 to %d, recorded them in %s",
		VersionTable, from, u.version, VersionTable), "schema_version", u.version)
	return false, nil
}

// notOwner handles Up run as a role without the rights of the schema's
// owner (an application role, as when every instance runs Up at start-up):
// it may not read VersionTable, and could not replace the functions
// anyway. With the schema at the last version or newer there is nothing to
// do (done); with a migration pending it is a *NotOwnerError. The session
// holds the migration lock, so an owner's Up in progress is waited for.
func notOwner(ctx context.Context, conn *sql.Conn, sources []*goose.Source) (done bool, err error) {
	var s pgcore.Schema
	if err := conn.QueryRowContext(ctx, pgcore.SchemaSQL).Scan(s.Dest()...); err != nil {
		return false, fmt.Errorf("migrations: up: inspect schema fencelock: %w", err)
	}
	owner, other := s.OtherOwner()
	if !other {
		return false, nil
	}
	var last int64
	for _, src := range sources {
		last = max(last, src.Version)
	}
	if s.Version.Int64 >= last {
		return true, nil
	}
	// The fix names where this connection goes when the driver says (pgx),
	// else the server's view of the session.
	var where *pgcore.Target
	_ = conn.Raw(func(dc any) error { where = pgcore.DriverTarget(dc); return nil })
	return false, &NotOwnerError{Role: s.User, Owner: owner, Version: s.Version.Int64, Last: last, Fix: s.Fix(where)}
}
