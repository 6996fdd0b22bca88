package migrations_test

import (
	"bytes"
	"database/sql"
	"fmt"
	"regexp"
	"sync"
	"testing"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// logBuf is a Logger that keeps what it is given.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuf) Printf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.buf, format+"\n", v...)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
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
	installWithGooseDefaultTable(t, db, 2)

	st := requireAllState(t, db, goose.StateApplied)
	assert.False(t, st[0].AppliedAt.IsZero(), "the time goose_db_version recorded")

	var logs logBuf
	require.NoError(t, migrations.Up(ctx, db, migrations.WithLogger(&logs)))
	assert.Equal(t, []int64{1, 2}, recorded(t, db))
	assert.Contains(t, logs.String(), "goose_db_version records versions 1, 2")
	assert.Contains(t, logs.String(), "recorded them in fencelock_db_version")
	requireAllState(t, db, goose.StateApplied)

	logs = logBuf{}
	require.NoError(t, migrations.Up(ctx, db, migrations.WithLogger(&logs)), "Up again")
	assert.Empty(t, logs.String(), "adopted once")
	assert.Equal(t, []int64{1, 2}, recorded(t, db))
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM goose_db_version WHERE version_id > 0`).Scan(&n))
	assert.Equal(t, 2, n, "goose_db_version untouched")

	var prev int64
	require.NoError(t, db.QueryRowContext(ctx, `SELECT fencelock.claim('r', 5, 'a')`).Scan(&prev))

	// And the adopted schema is a normal one: Down removes it.
	require.NoError(t, migrations.Down(ctx, db))
	assert.False(t, schemaExists(t, db))
	assert.Empty(t, recorded(t, db))
}

// Installed only up to 00001 by the CLI: Up adopts version 1 and applies 2.
func TestUpAdoptsPartialSchema(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	installWithGooseDefaultTable(t, db, 1)
	st, err := migrations.Status(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, goose.StateApplied, st[0].State)
	assert.Equal(t, goose.StatePending, st[1].State)

	var logs logBuf
	require.NoError(t, migrations.Up(ctx, db, migrations.WithLogger(&logs)))
	assert.Contains(t, logs.String(), "matches migrations 1 to 1")
	assert.Equal(t, []int64{1, 2}, recorded(t, db))
	assert.Equal(t, wantFunctions, functionNames(t, db))
}

// A schema that is not what the migrations create is one error, with what
// differs and a fix that works as written.
func TestUpRefusesSchemaThatDiffers(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	installWithGooseDefaultTable(t, db, 2)
	_, err := db.ExecContext(ctx, `CREATE OR REPLACE FUNCTION fencelock.prune(p_older_than interval) RETURNS bigint LANGUAGE sql AS $$ SELECT 0::bigint $$`)
	require.NoError(t, err)

	_, err = migrations.Status(ctx, db)
	require.ErrorIs(t, err, migrations.ErrUnrecorded)
	err = migrations.Up(ctx, db)
	require.ErrorIs(t, err, migrations.ErrUnrecorded)
	msg := err.Error()
	assert.NotContains(t, msg, "\n")
	assert.Contains(t, msg, "function fencelock.prune differs")
	assert.Empty(t, recorded(t, db), "nothing recorded")

	// The fix, as written in the message.
	fix := regexp.MustCompile(`drop it \(([^;]+);`).FindStringSubmatch(msg)
	require.Len(t, fix, 2, msg)
	_, err = db.ExecContext(ctx, fix[1])
	require.NoError(t, err, fix[1])
	require.NoError(t, migrations.Up(ctx, db))
	assert.Equal(t, []int64{1, 2}, recorded(t, db))
	assert.Equal(t, wantFunctions, functionNames(t, db))
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
