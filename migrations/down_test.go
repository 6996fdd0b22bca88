package migrations_test

import (
	"database/sql"
	"log/slog"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func requireAllState(t *testing.T, db *sql.DB, want goose.State) []*goose.MigrationStatus {
	t.Helper()
	st, err := migrations.Status(ctxT(t), db)
	require.NoError(t, err)
	require.Len(t, st, len(allVersions(t)))
	for _, s := range st {
		assert.Equal(t, want, s.State, s.Source.Path)
	}
	return st
}

// Down through the plain goose CLI (package API) also refuses while a table
// is protected: Postgres names the table. goose runs each Down in its own
// transaction, so 00005, 00004 and the outbox (00003) go first; 00002's Down
// refuses, and the functions that fence the table stay, with its trigger.
func TestGooseCLIDownRefusesProtectedTable(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	require.NoError(t, migrations.Up(ctx, db))
	_, err := db.ExecContext(ctx, `CREATE TABLE stock (n int);
		CREATE TRIGGER fencelock_protect BEFORE INSERT ON stock FOR EACH STATEMENT EXECUTE FUNCTION fencelock.protect_guard()`)
	require.NoError(t, err)
	_, err = gooseProvider(t, db, migrations.FS()).DownTo(ctx, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "tables still protected by pgfence Protect: public.stock")
	assert.True(t, schemaExists(t, db))
	var kept []string
	for _, f := range wantFunctions {
		if !strings.HasPrefix(f, "outbox_") {
			kept = append(kept, f)
		}
	}
	assert.Equal(t, kept, functionNames(t, db), "00002's functions stay")
	_, _, triggers := objects(t, db)
	assert.Equal(t, 1, triggers, "the table's trigger stays")
	var v int64
	require.NoError(t, db.QueryRowContext(ctx, `SELECT fencelock.schema_version()`).Scan(&v))
	assert.EqualValues(t, 2, v)
	assert.Equal(t, []int64{1, 2}, recorded(t, db))
}

func TestOptions(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	err := migrations.Up(ctx, db, migrations.Force())
	require.ErrorIs(t, err, migrations.ErrInvalidOption)
	assert.Contains(t, err.Error(), "Force applies to Down only")
	_, err = migrations.Status(ctx, db, migrations.Force())
	require.ErrorIs(t, err, migrations.ErrInvalidOption)
	require.ErrorIs(t, migrations.Up(ctx, db, nil), migrations.ErrInvalidOption)
	require.ErrorIs(t, migrations.Up(ctx, db, migrations.WithLogger(nil)), migrations.ErrInvalidOption)
	assert.False(t, schemaExists(t, db), "a bad option does nothing")
	require.NoError(t, migrations.Up(ctx, db, migrations.WithLogger(slog.New(slog.NewTextHandler(&strings.Builder{}, nil)))))
	require.NoError(t, migrations.Down(ctx, db, migrations.Force()), "Force without protected tables")
	assert.False(t, schemaExists(t, db))
}

// A Down restores what its Up replaced: for every k, the catalog after Up
// to k, Up to the last and Down to k is the catalog after Up to k
// (functions with their bodies, ACLs, comments, tables, columns,
// constraints, indexes, triggers).
func TestDownRestoresCatalog(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	p := gooseProvider(t, db, migrations.FS())
	versions := allVersions(t)
	for _, k := range versions[:len(versions)-1] {
		_, err := p.UpTo(ctx, k)
		require.NoError(t, err)
		want := catalog(t, db)
		_, err = p.Up(ctx)
		require.NoError(t, err)
		_, err = p.DownTo(ctx, k)
		require.NoError(t, err)
		got := catalog(t, db)
		assert.Empty(t, catalogDiff(want, got), "Down to %d", k)
		assert.Equal(t, want, got, "Down to %d", k)
	}
}
