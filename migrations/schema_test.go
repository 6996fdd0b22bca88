package migrations_test

import (
	"database/sql"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// entryPoints are the functions callers use: SECURITY DEFINER with a pinned
// search_path, but for hotPath. The rest are helpers that run inside them.
var entryPoints = []string{"advance", "claim", "close", "open",
	"outbox_ack", "outbox_add", "outbox_backlog", "outbox_claim", "outbox_counts", "outbox_list", "outbox_release", "outbox_requeue", "outbox_retry", "outbox_revive",
	"precheck", "protect_guard", "prune", "run_state"}

// hotPath are the functions every guarded transaction (open, close) or
// every recorded effect (outbox_guard, the outbox's row trigger) runs: no
// SET clause (a settings save and restore per call), every name qualified
// instead (TestHotPathQualified, TestHotPathHostileSearchPath).
var hotPath = map[string]bool{"open": true, "close": true, "outbox_guard": true}

// A DBA reads the schema in \d+ and \df+: every table and function says
// what it is. Entry points run as their owner with a pinned search_path;
// nothing is executable by PUBLIC.
func TestSchemaCatalog(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	require.NoError(t, migrations.Up(ctx, db))

	rows, err := db.QueryContext(ctx, `
SELECT c.relname, coalesce(obj_description(c.oid, 'pg_class'), '')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'fencelock' AND c.relkind = 'r' ORDER BY 1`)
	require.NoError(t, err)
	var tables []string
	for rows.Next() {
		var name, comment string
		require.NoError(t, rows.Scan(&name, &comment))
		tables = append(tables, name)
		assert.NotEmpty(t, comment, "COMMENT ON TABLE fencelock.%s", name)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	assert.Equal(t, []string{"applied", "fence", "outbox", "runs"}, tables)

	rows, err = db.QueryContext(ctx, `
SELECT p.proname, coalesce(obj_description(p.oid, 'pg_proc'), ''), p.prosecdef,
       coalesce(array_to_string(p.proconfig, ';'), ''),
       has_function_privilege('public', p.oid, 'EXECUTE')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'fencelock' ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	var definers []string
	for rows.Next() {
		var name, comment, config string
		var secdef, public bool
		require.NoError(t, rows.Scan(&name, &comment, &secdef, &config, &public))
		assert.NotEmpty(t, comment, "COMMENT ON FUNCTION fencelock.%s", name)
		assert.False(t, public, "fencelock.%s executable by PUBLIC", name)
		switch {
		case secdef && hotPath[name]:
			definers = append(definers, name)
			assert.Empty(t, config, "fencelock.%s has no SET clause", name)
		case secdef:
			definers = append(definers, name)
			assert.Equal(t, "search_path=pg_catalog, pg_temp", config, "fencelock.%s pins its search_path", name)
		case strings.HasSuffix(name, "_full"):
			assert.Equal(t, "search_path=pg_catalog, pg_temp", config, "fencelock.%s pins its search_path (open and close do not)", name)
		}
	}
	require.NoError(t, rows.Err())
	sort.Strings(definers)
	assert.Equal(t, entryPoints, definers)
}

// Each SQLSTATE comes with its one DETAIL shape, whichever function raised
// it.
func TestSQLStateDetails(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	ctx := ctxT(t)
	require.NoError(t, migrations.Up(ctx, db))
	tx := txRunner(t, db)

	require.NoError(t, tx(`SELECT fencelock.claim('r', 5, 'a', 'k1')`))
	require.NoError(t, tx(`SELECT fencelock.close('r', 5, 'a', NULL, 'run', NULL, true)`))
	_, err := db.ExecContext(ctx, `CREATE TABLE stock (n int);
		CREATE TRIGGER fencelock_protect BEFORE INSERT ON stock FOR EACH STATEMENT EXECUTE FUNCTION fencelock.protect_guard('r')`)
	require.NoError(t, err)

	cases := []struct {
		code string
		keys []string
		sql  []string
	}{
		{"FL001", []string{"current", "resource", "token"}, []string{
			`SELECT fencelock.claim('r', 4, 'b')`, `SELECT fencelock.claim('r', 5, 'b')`,
			`SELECT fencelock.advance('r', 4, 'b')`, `SELECT fencelock.open('r', 4, 'b')`,
			`SELECT fencelock.precheck('r', 5, 'b')`, `SELECT fencelock.close('r', 4, 'b')`,
		}},
		{"FL002", []string{"claimed", "required", "table"}, []string{
			`INSERT INTO stock VALUES (1)`,
			`SELECT fencelock.claim('other', 1, 'a'); INSERT INTO stock VALUES (1)`,
		}},
		{"FL003", []string{"key", "resource", "token"}, []string{
			`SELECT fencelock.claim('r', 5, 'a', 'k1')`, `SELECT fencelock.open('r', 5, 'a', 'k1')`,
			`SELECT fencelock.close('r', 5, 'a', 'k1')`, `SELECT fencelock.precheck('r', 5, 'a', 'k1')`,
		}},
		{"FL004", []string{"resource", "run_key", "token"}, []string{
			`SELECT fencelock.open('r', 5, 'a', NULL, 'run')`, `SELECT fencelock.close('r', 5, 'a', NULL, 'run', 'c')`,
		}},
		{"22023", nil, []string{
			`SELECT fencelock.claim('', 1, 'a')`, `SELECT fencelock.claim('r', 0, 'a')`, `SELECT fencelock.advance('r', 6, '')`,
			`SELECT fencelock.open('r', 6, 'a', '')`, `SELECT fencelock.close('r', 6, 'a', NULL, NULL, 'x')`,
		}},
	}
	for _, c := range cases {
		for _, q := range c.sql {
			err := tx(q)
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "%s: %v", q, err)
			assert.Equal(t, c.code, pgErr.Code, q)
			assert.Regexp(t, `^fencelock: `, pgErr.Message, q)
			if c.keys == nil {
				continue
			}
			var detail map[string]any
			require.NoError(t, json.Unmarshal([]byte(pgErr.Detail), &detail), "%s: DETAIL %q", q, pgErr.Detail)
			keys := make([]string, 0, len(detail))
			for k := range detail {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			assert.Equal(t, c.keys, keys, q)
		}
	}
}

// txRunner runs statements in one transaction and commits; the first
// error rolls back.
func txRunner(t *testing.T, db *sql.DB) func(stmts ...string) error {
	return func(stmts ...string) error {
		t.Helper()
		ctx := ctxT(t)
		x, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for _, s := range stmts {
			if _, err := x.ExecContext(ctx, s); err != nil {
				_ = x.Rollback()
				return err
			}
		}
		return x.Commit()
	}
}
