package migrations_test

import (
	"context"
	"database/sql"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func openDB(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// objects lists what lives in the fencelock schema, and the triggers that
// use its functions on tables outside it.
func objects(t *testing.T, db *sql.DB) (tables, functions, triggers int) {
	t.Helper()
	ctx := ctxT(t)
	q := func(sql string) int {
		var n int
		require.NoError(t, db.QueryRowContext(ctx, sql).Scan(&n))
		return n
	}
	tables = q(`SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'fencelock'`)
	functions = q(`SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'fencelock'`)
	triggers = q(`SELECT count(*) FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_namespace n ON n.oid = p.pronamespace
		JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace tn ON tn.oid = c.relnamespace WHERE n.nspname = 'fencelock' AND tn.nspname <> 'fencelock'`)
	return
}

var wantFunctions = []string{"advance", "apply_key", "check_args", "check_token", "claim", "close", "close_full", "open", "open_full",
	"outbox_ack", "outbox_add", "outbox_backlog", "outbox_claim", "outbox_counts", "outbox_guard", "outbox_heads", "outbox_list", "outbox_release", "outbox_requeue", "outbox_retry", "outbox_revive",
	"precheck", "protect_guard", "prune", "raise_applied", "raise_finished", "raise_invalid", "raise_stale", "run_state", "schema_version"}

// allVersions are the versions of the embedded migrations, in order.
func allVersions(t *testing.T) []int64 {
	t.Helper()
	files, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	var vs []int64
	for _, f := range files {
		v, err := goose.NumericComponent(f)
		require.NoError(t, err, f)
		vs = append(vs, v)
	}
	require.NotEmpty(t, vs)
	return vs
}

func lastVersion(t *testing.T) int64 { vs := allVersions(t); return vs[len(vs)-1] }

// versionList is vs as Up's messages write it: "1, 2".
func versionList(vs []int64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(s, ", ")
}

func functionNames(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.QueryContext(ctxT(t), `SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'fencelock' ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	var names []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		names = append(names, s)
	}
	require.NoError(t, rows.Err())
	return names
}

func schemaExists(t *testing.T, db *sql.DB) bool {
	var ok bool
	require.NoError(t, db.QueryRowContext(ctxT(t), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'fencelock')`).Scan(&ok))
	return ok
}

func TestUpDownUp(t *testing.T) {
	tdb := testenv.NewDB(t)
	db := openDB(t, tdb.URL)
	ctx := ctxT(t)

	st, err := migrations.Status(ctx, db)
	require.NoError(t, err)
	require.NotEmpty(t, st)
	for _, s := range st {
		assert.Equal(t, goose.StatePending, s.State)
	}

	require.NoError(t, migrations.Up(ctx, db))
	require.NoError(t, migrations.Up(ctx, db), "Up again is a no-op")
	st, err = migrations.Status(ctx, db)
	require.NoError(t, err)
	for _, s := range st {
		assert.Equal(t, goose.StateApplied, s.State, s.Source.Path)
	}
	tables, functions, _ := objects(t, db)
	assert.Positive(t, tables)
	assert.Equal(t, len(wantFunctions), functions)
	assert.Equal(t, wantFunctions, functionNames(t, db))

	// The schema works: claim, and protect a user table by hand.
	_, err = db.ExecContext(ctx, `CREATE TABLE stock (n int)`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO stock VALUES (1)`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `CREATE TRIGGER fencelock_protect BEFORE INSERT ON stock FOR EACH STATEMENT EXECUTE FUNCTION fencelock.protect_guard()`)
	require.NoError(t, err)
	var prev int64
	require.NoError(t, db.QueryRowContext(ctx, `SELECT fencelock.claim('r', 5, 'a')`).Scan(&prev))
	assert.EqualValues(t, 0, prev)
	_, err = db.ExecContext(ctx, `SELECT fencelock.claim('r', 4, 'b')`)
	require.ErrorContains(t, err, "FL001")
	// precheck: the non-locking check guard.Exec runs at begin.
	require.NoError(t, db.QueryRowContext(ctx, `SELECT fencelock.precheck('r', 6, 'b')`).Scan(&prev))
	assert.EqualValues(t, 5, prev)
	_, err = db.ExecContext(ctx, `SELECT fencelock.precheck('r', 4, 'b')`)
	require.ErrorContains(t, err, "FL001")
	_, _, triggers := objects(t, db)
	assert.Equal(t, 1, triggers)

	// Down refuses while the table is protected, naming it, and leaves
	// everything as it was.
	err = migrations.Down(ctx, db)
	var perr *migrations.ProtectedError
	require.ErrorAs(t, err, &perr)
	require.ErrorIs(t, err, migrations.ErrProtected)
	assert.Equal(t, []string{"public.stock"}, perr.Tables)
	assert.Contains(t, err.Error(), "public.stock")
	assert.Contains(t, err.Error(), "migrations.Force()")
	assert.True(t, schemaExists(t, db))
	_, _, triggers = objects(t, db)
	assert.Equal(t, 1, triggers)

	// Forced, Down removes all of it, including the trigger on the user's
	// table, and leaves the user's data alone.
	require.NoError(t, migrations.Down(ctx, db, migrations.Force()))
	assert.False(t, schemaExists(t, db))
	tables, functions, triggers = objects(t, db)
	assert.Zero(t, tables)
	assert.Zero(t, functions)
	assert.Zero(t, triggers)
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM stock`).Scan(&n))
	assert.Equal(t, 1, n)
	st, err = migrations.Status(ctx, db)
	require.NoError(t, err)
	for _, s := range st {
		assert.Equal(t, goose.StatePending, s.State)
	}
	require.NoError(t, migrations.Down(ctx, db), "Down again is a no-op")

	// Up after Down.
	require.NoError(t, migrations.Up(ctx, db))
	assert.True(t, schemaExists(t, db))
	assert.Equal(t, wantFunctions, functionNames(t, db))
}

// Two processes migrating the same database at once take turns on goose's
// Postgres session lock: both succeed, each migration is applied once.
func TestConcurrentUp(t *testing.T) {
	tdb := testenv.NewDB(t)
	const procs = 3
	dbs := make([]*sql.DB, procs)
	for i := range dbs {
		dbs[i] = openDB(t, tdb.URL) // separate pools: separate sessions
	}
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make([]error, procs)
	start := make(chan struct{})
	for i := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = migrations.Up(ctx, dbs[i])
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "migrator %d", i)
	}
	var applied int
	require.NoError(t, dbs[0].QueryRowContext(ctx,
		`SELECT count(*) FROM `+migrations.VersionTable+` WHERE version_id > 0 AND is_applied`).Scan(&applied))
	files, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	assert.Equal(t, len(files), applied, "each migration recorded exactly once")
	assert.Equal(t, wantFunctions, functionNames(t, dbs[0]))
}

// The files are plain goose SQL migrations: goose's own package-level API
// (what the goose CLI runs) applies them from the embedded FS too.
func TestFilesApplyWithGooseCLIAPI(t *testing.T) {
	tdb := testenv.NewDB(t)
	db := openDB(t, tdb.URL)
	ctx := ctxT(t)
	// Package-level goose state: this test must not run in parallel.
	goose.SetBaseFS(migrations.FS())
	goose.SetTableName(migrations.VersionTable)
	goose.SetLogger(goose.NopLogger())
	t.Cleanup(func() {
		goose.SetBaseFS(nil)
		goose.SetTableName(goose.DefaultTablename)
	})
	require.NoError(t, goose.SetDialect("postgres"))
	require.NoError(t, goose.UpContext(ctx, db, "."))
	assert.True(t, schemaExists(t, db))
	// The helpers see the CLI's work.
	st, err := migrations.Status(ctx, db)
	require.NoError(t, err)
	for _, s := range st {
		assert.Equal(t, goose.StateApplied, s.State)
	}
	require.NoError(t, goose.DownToContext(ctx, db, ".", 0))
	assert.False(t, schemaExists(t, db))
}

func TestNilDB(t *testing.T) {
	ctx := ctxT(t)
	require.ErrorIs(t, migrations.Up(ctx, nil), migrations.ErrNilDB)
	require.ErrorIs(t, migrations.Down(ctx, nil), migrations.ErrNilDB)
	_, err := migrations.Status(ctx, nil)
	require.ErrorIs(t, err, migrations.ErrNilDB)
}

func TestFS(t *testing.T) {
	files, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	b, err := fs.ReadFile(migrations.FS(), files[0])
	require.NoError(t, err)
	assert.Contains(t, string(b), "-- +goose Up")
	assert.Contains(t, string(b), "-- +goose Down")
}

// open and close called by hand, on the paths guard.Exec does not take:
// close without a stored token (a new resource, a lower stored token)
// stores it, as claim would; a newer stored token is FL001; a finished run
// is FL004 at open and at close; bad arguments are 22023.
func TestOpenCloseByHand(t *testing.T) {
	tdb := testenv.NewDB(t)
	db := openDB(t, tdb.URL)
	ctx := ctxT(t)
	require.NoError(t, migrations.Up(ctx, db))
	tx := txRunner(t, db)
	token := func() (tok int64, holder string) {
		t.Helper()
		require.NoError(t, db.QueryRowContext(ctx, `SELECT token, holder FROM fencelock.fence WHERE resource = 'r'`).Scan(&tok, &holder))
		return
	}

	require.NoError(t, tx(`SELECT fencelock.open('r', 3, 'a', 'k1')`, `SELECT fencelock.close('r', 3, 'a', 'k1')`), "new resource")
	tok, h := token()
	assert.EqualValues(t, 3, tok)
	assert.Equal(t, "a", h)
	require.NoError(t, tx(`SELECT fencelock.close('r', 5, 'b', NULL, 'run', '7')`), "higher than stored")
	tok, h = token()
	assert.EqualValues(t, 5, tok)
	assert.Equal(t, "b", h)

	require.ErrorContains(t, tx(`SELECT fencelock.open('r', 4, 'a')`), "FL001")
	require.ErrorContains(t, tx(`SELECT fencelock.close('r', 4, 'a')`), "FL001")
	require.ErrorContains(t, tx(`SELECT fencelock.close('r', 5, 'c')`), "FL001", "same token, other holder")
	require.ErrorContains(t, tx(`SELECT fencelock.open('r', 5, 'b', 'k1')`), "FL003")
	require.ErrorContains(t, tx(`SELECT fencelock.close('r', 5, 'b', 'k1')`), "FL003")

	// A key and a run in one close, through close's fast path: the first
	// step of a new run with a new key (the fast path finds no run row and
	// hands over to close_full, which must not find the key already
	// recorded by this call); a next step; a repeated key refused with
	// the run's cursor left where it was.
	cursorOf := func(run string) (c string) {
		t.Helper()
		require.NoError(t, db.QueryRowContext(ctx, `SELECT cursor FROM fencelock.runs WHERE run_key = $1`, run).Scan(&c))
		return c
	}
	require.NoError(t, tx(`SELECT fencelock.close('r', 5, 'b', 'k5', 'run2', '1')`), "first step, new key")
	require.NoError(t, tx(`SELECT fencelock.close('r', 5, 'b', 'k6', 'run2', '2')`), "next step, new key")
	assert.Equal(t, "2", cursorOf("run2"))
	require.ErrorContains(t, tx(`SELECT fencelock.close('r', 5, 'b', 'k6', 'run2', '3')`), "FL003", "applied key with a run")
	assert.Equal(t, "2", cursorOf("run2"), "nothing of the refused close stays")

	var cursor string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT cursor FROM fencelock.runs WHERE run_key = 'run'`).Scan(&cursor))
	assert.Equal(t, "7", cursor)
	require.NoError(t, tx(`SELECT fencelock.open('r', 5, 'b', NULL, 'run')`, `SELECT fencelock.close('r', 5, 'b', NULL, 'run', '8')`))
	require.NoError(t, tx(`SELECT fencelock.close('r', 5, 'b', NULL, 'run', NULL, true)`))
	require.NoError(t, tx(`SELECT fencelock.close('r', 5, 'b', NULL, 'run', NULL, true)`), "finishing twice is a no-op")
	require.NoError(t, db.QueryRowContext(ctx, `SELECT cursor FROM fencelock.runs WHERE run_key = 'run' AND finished AND finished_at IS NOT NULL`).Scan(&cursor))
	assert.Equal(t, "8", cursor)
	require.ErrorContains(t, tx(`SELECT fencelock.open('r', 5, 'b', NULL, 'run')`), "FL004")
	require.ErrorContains(t, tx(`SELECT fencelock.open('r', 5, 'b', NULL, 'run')`), "finished (by token 5)")
	require.ErrorContains(t, tx(`SELECT fencelock.close('r', 5, 'b', NULL, 'run', '9')`), "FL004")

	for _, bad := range []string{
		`SELECT fencelock.open('', 1, 'a')`, `SELECT fencelock.open('r', 0, 'a')`, `SELECT fencelock.open('r', 6, '')`,
		`SELECT fencelock.open('r', 6, 'a', '')`, `SELECT fencelock.open('r', 6, 'a', NULL, '')`,
		`SELECT fencelock.close('', 1, 'a')`, `SELECT fencelock.close('r', 6, 'a', '')`,
		`SELECT fencelock.close('r', 6, 'a', NULL, '', 'x')`, `SELECT fencelock.close('r', 6, 'a', NULL, NULL, 'x')`,
		`SELECT fencelock.close('r', 6, 'a', NULL, NULL, NULL, true)`,
	} {
		require.ErrorContains(t, tx(bad), "22023", bad)
	}
	tok, _ = token()
	assert.EqualValues(t, 5, tok, "nothing refused was stored")
}
