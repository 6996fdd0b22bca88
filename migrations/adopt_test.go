package migrations_test

import (
	"bytes"
	"database/sql"
	"log/slog"
	"regexp"
	"sync"
	"testing"

	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// logBuf keeps what a logger writes, as text.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// logger returns a text logger into l at level.
func (l *logBuf) logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: level}))
}

// installWithGooseDefaultTable installs the migrations as the goose CLI does
// when it is run without -table: versions go to goose_db_version.
func installWithGooseDefaultTable(t *testing.T, db *sql.DB, upTo int64) {
	t.Helper()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS()) // default table
	require.NoError(t, err)
	require.Equal(t, goose.DefaultTablename, "goose_db_version")
	_, err = p.UpTo(ctxT(t), upTo)
	require.NoError(t, err)
}

func recorded(t *testing.T, db *sql.DB) []int64 {
	t.Helper()
	var exists bool
	require.NoError(t, db.QueryRowContext(ctxT(t), `SELECT to_regclass($1) IS NOT NULL`, migrations.VersionTable).Scan(&exists))
	if !exists {
		return nil
	}
	rows, err := db.QueryContext(ctxT(t), `SELECT version_id FROM `+migrations.VersionTable+` WHERE version_id > 0 AND is_applied ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	var vs []int64
	for rows.Next() {
		var v int64
		require.NoError(t, rows.Scan(&v))
		vs = append(vs, v)
	}
	require.NoError(t, rows.Err())
	return vs
}

// Installed by the goose CLI without -table fencelock_db_version: Status
// says installed, Up adopts it (records the versions, logs it) and the
// schema works; goose_db_version is left alone.
func TestUpAdoptsSchemaInstalledWithGooseDefaultTable(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	installWithGooseDefaultTable(t, db, lastVersion(t))

	st := requireAllState(t, db, goose.StateApplied)
	assert.False(t, st[0].AppliedAt.IsZero(), "the time goose_db_version recorded")

	var logs logBuf
	require.NoError(t, migrations.Up(ctx, db, migrations.WithLogger(logs.logger(slog.LevelInfo))))
	assert.Equal(t, allVersions(t), recorded(t, db))
	assert.Contains(t, logs.String(), "goose_db_version records versions "+versionList(allVersions(t)))
	assert.Contains(t, logs.String(), "recorded them in fencelock_db_version")
	requireAllState(t, db, goose.StateApplied)

	logs.buf.Reset()
	require.NoError(t, migrations.Up(ctx, db, migrations.WithLogger(logs.logger(slog.LevelInfo))), "Up again")
	assert.Empty(t, logs.String(), "adopted once")
	assert.Equal(t, allVersions(t), recorded(t, db))
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM goose_db_version WHERE version_id > 0`).Scan(&n))
	assert.Equal(t, len(allVersions(t)), n, "goose_db_version untouched")

	var prev int64
	require.NoError(t, db.QueryRowContext(ctx, `SELECT fencelock.claim('r', 5, 'a')`).Scan(&prev))

	// And the adopted schema is a normal one: Down removes it.
	require.NoError(t, migrations.Down(ctx, db))
	assert.False(t, schemaExists(t, db))
	assert.Empty(t, recorded(t, db))
}

// Installed only up to 00001 by the CLI: Up adopts version 1 and applies
// the rest.
func TestUpAdoptsPartialSchema(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	installWithGooseDefaultTable(t, db, 1)
	st, err := migrations.Status(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, goose.StateApplied, st[0].State)
	for _, s := range st[1:] {
		assert.Equal(t, goose.StatePending, s.State, s.Source.Path)
	}

	var logs logBuf
	require.NoError(t, migrations.Up(ctx, db, migrations.WithLogger(logs.logger(slog.LevelInfo))))
	assert.Contains(t, logs.String(), "matches migrations 1 to 1")
	assert.Equal(t, allVersions(t), recorded(t, db))
	assert.Equal(t, wantFunctions, functionNames(t, db))
}

// A schema that says it implements a version these migrations do not have
// (a newer fencelock installed it), and one without schema_version() at
// all (made by hand, or by an older fencelock), are one error each, with
// the reason and a fix that works as written.
func TestUpRefusesSchemaItCannotAdopt(t *testing.T) {
	for name, c := range map[string]struct{ change, want string }{
		"newer": {`CREATE OR REPLACE FUNCTION fencelock.schema_version() RETURNS bigint LANGUAGE sql AS $$ SELECT 99::bigint $$`,
			"schema_version() says it implements version 99"},
		"no version": {`DROP FUNCTION fencelock.schema_version()`, "it has no function fencelock.schema_version()"},
	} {
		t.Run(name, func(t *testing.T) {
			db := openDB(t, testenv.NewDB(t).URL)
			ctx := ctxT(t)
			installWithGooseDefaultTable(t, db, lastVersion(t))
			_, err := db.ExecContext(ctx, c.change)
			require.NoError(t, err)

			_, err = migrations.Status(ctx, db)
			require.ErrorIs(t, err, migrations.ErrUnrecorded)
			err = migrations.Up(ctx, db)
			require.ErrorIs(t, err, migrations.ErrUnrecorded)
			msg := err.Error()
			assert.NotContains(t, msg, "\n")
			assert.Contains(t, msg, c.want)
			assert.Empty(t, recorded(t, db), "nothing recorded")

			// The fix, as written in the message.
			fix := regexp.MustCompile(`drop it \(([^;]+);`).FindStringSubmatch(msg)
			require.Len(t, fix, 2, msg)
			_, err = db.ExecContext(ctx, fix[1])
			require.NoError(t, err, fix[1])
			require.NoError(t, migrations.Up(ctx, db))
			assert.Equal(t, allVersions(t), recorded(t, db))
			assert.Equal(t, wantFunctions, functionNames(t, db))
		})
	}
}

// Every migration redefines fencelock.schema_version() to return its own
// version, and its Down restores the one before: what adoption and the
// stores' check rely on. The stores need the last one.
func TestSchemaVersionPerMigration(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	p := gooseProvider(t, db, migrations.FS())
	version := func() (v int64) {
		t.Helper()
		var read int64
		require.NoError(t, db.QueryRowContext(ctx, `SELECT fencelock.schema_version()`).Scan(&v))
		require.NoError(t, db.QueryRowContext(ctx, `SELECT `+pgcore.SchemaVersionSQL+` FROM pg_namespace n WHERE n.nspname = 'fencelock'`).Scan(&read))
		assert.Equal(t, v, read, "the version read from the catalog (pgcore.SchemaVersionSQL) is what schema_version() returns")
		return v
	}
	versions := allVersions(t)
	assert.EqualValues(t, lastVersion(t), pgcore.SchemaVersion, "the stores need the schema of the last migration: set pgcore.SchemaVersion")
	for _, v := range versions {
		_, err := p.UpByOne(ctx)
		require.NoError(t, err)
		assert.Equal(t, v, version(), "after Up to %d", v)
	}
	for i := len(versions) - 1; i > 0; i-- {
		_, err := p.Down(ctx)
		require.NoError(t, err)
		assert.Equal(t, versions[i-1], version(), "after Down from %d", versions[i])
	}
}

// goose's own messages reach WithLogger's logger at Debug, so an Info
// logger sees only what Up itself says.
func TestLoggerGooseAtDebug(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	var info, debug logBuf
	require.NoError(t, migrations.Up(ctx, db, migrations.WithLogger(info.logger(slog.LevelInfo))))
	assert.Empty(t, info.String())
	require.NoError(t, migrations.Down(ctx, db, migrations.WithLogger(debug.logger(slog.LevelDebug))))
	assert.Regexp(t, `level=DEBUG msg="migration completed" logger=goose direction=down .*source=00001_tables.sql`, debug.String())
	assert.NotContains(t, debug.String(), "level=INFO")
}

// An empty schema named fencelock (made by hand) is not adopted either.
func TestUpRefusesEmptySchema(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	_, err := db.ExecContext(ctx, `CREATE SCHEMA fencelock`)
	require.NoError(t, err)
	err = migrations.Up(ctx, db)
	require.ErrorIs(t, err, migrations.ErrUnrecorded)
	assert.Contains(t, err.Error(), "holds none of fencelock's tables or functions")
}

// Recorded as installed, but the schema was dropped by hand: Up and Status
// say so, and the fix in the message works.
func TestUpRecordedButMissing(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	require.NoError(t, migrations.Up(ctx, db))
	_, err := db.ExecContext(ctx, `DROP SCHEMA fencelock CASCADE`)
	require.NoError(t, err)
	_, err = migrations.Status(ctx, db)
	require.ErrorIs(t, err, migrations.ErrRecordedMissing)
	err = migrations.Up(ctx, db)
	require.ErrorIs(t, err, migrations.ErrRecordedMissing)
	fix := regexp.MustCompile(`\((DELETE FROM [^)]+)\)`).FindStringSubmatch(err.Error())
	require.Len(t, fix, 2, err.Error())
	_, err = db.ExecContext(ctx, fix[1])
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, db))
	assert.True(t, schemaExists(t, db))
}
