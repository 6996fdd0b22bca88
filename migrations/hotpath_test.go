package migrations_test

import (
	"database/sql"
	"regexp"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hotPathSource returns the body of each hot-path function as the
// database holds it.
func hotPathSource(t *testing.T, db *sql.DB) map[string]string {
	t.Helper()
	rows, err := db.QueryContext(ctxT(t), `
SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'fencelock' AND p.proname = ANY ($1)`, hotPathNames())
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, src string
		require.NoError(t, rows.Scan(&name, &src))
		out[name] = src
	}
	require.NoError(t, rows.Err())
	require.Len(t, out, len(hotPath))
	return out
}

var (
	qualifiedOp   = regexp.MustCompile(`OPERATOR\(pg_catalog\.[^)]+\)`)
	stringLit     = regexp.MustCompile(`'[^']*'`)
	lineComment   = regexp.MustCompile(`--[^\n]*`)
	updateSet     = regexp.MustCompile(`(?s)\bSET\b.*?\bWHERE\b`)
	raiseOption   = regexp.MustCompile(`\b(ERRCODE|DETAIL)\s*=`)
	assignment    = regexp.MustCompile(`:=`)
	bareOperator  = regexp.MustCompile(`[=<>!+*/|~^%@#&?-]`)
	cast          = regexp.MustCompile(`::\s*([A-Za-z_][A-Za-z0-9_.]*)`)
	call          = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_.]*)\s*\(`)
	keywordCalls  = map[string]bool{"coalesce": true, "values": true, "conflict": true, "in": true, "if": true, "or": true, "and": true, "not": true, "when": true, "then": true, "else": true, "where": true, "return": true}
	keywordTypes  = map[string]bool{"bigint": true, "boolean": true, "integer": true}
	qualifiedName = regexp.MustCompile(`^(pg_catalog|fencelock)\.`)
)

// hotPathNames are the names in hotPath.
func hotPathNames() []string {
	var out []string
	for name := range hotPath {
		out = append(out, name)
	}
	return out
}

// open and close run without a pinned search_path (SECURITY DEFINER, no
// SET clause), so that a caller's search_path cannot put its own operator,
// type or function in front of pg_catalog's, every one they use must be
// named with its schema. This reads their bodies and fails on any bare
// operator, unqualified cast or unqualified function call.
func TestHotPathQualified(t *testing.T) {
	db := openDB(t, testenv.NewDB(t).URL)
	require.NoError(t, migrations.Up(ctxT(t), db))
	for name, src := range hotPathSource(t, db) {
		body := lineComment.ReplaceAllString(src, "")
		body = stringLit.ReplaceAllString(body, "''")
		for _, m := range cast.FindAllStringSubmatch(body, -1) {
			typ := strings.ToLower(m[1])
			assert.True(t, keywordTypes[typ] || qualifiedName.MatchString(typ), "fencelock.%s: cast to %s is not schema-qualified", name, m[1])
		}
		body = cast.ReplaceAllString(body, "")
		for _, m := range call.FindAllStringSubmatch(body, -1) {
			fn := strings.ToLower(m[1])
			if keywordCalls[fn] || qualifiedName.MatchString(fn) || fn == "operator" {
				continue
			}
			// A table's column list: fencelock.applied (resource, ...).
			if strings.HasPrefix(fn, "fencelock.") {
				continue
			}
			t.Errorf("fencelock.%s: call of %s( is not schema-qualified", name, m[1])
		}
		body = qualifiedOp.ReplaceAllString(body, " ")
		body = updateSet.ReplaceAllStringFunc(body, func(s string) string { return strings.ReplaceAll(s, "=", " ") })
		body = assignment.ReplaceAllString(body, " ")
		body = raiseOption.ReplaceAllString(body, " ")
		for _, line := range strings.Split(body, "\n") {
			if bareOperator.MatchString(line) {
				t.Errorf("fencelock.%s: bare operator in %q (write OPERATOR(pg_catalog.x))", name, strings.TrimSpace(line))
			}
		}
	}
}

// The same, in behaviour: a session whose search_path puts a schema of
// hostile operators in front of pg_catalog (= always true, <> always
// false, for bigint and text) still gets a stale token refused by open and
// by close, and an applied key refused.
func TestHotPathHostileSearchPath(t *testing.T) {
	tdb := testenv.NewDB(t)
	db := openDB(t, tdb.URL)
	ctx := ctxT(t)
	require.NoError(t, migrations.Up(ctx, db))
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	exec := func(q string) error {
		_, err := conn.ExecContext(ctx, q)
		return err
	}
	require.NoError(t, exec(`CREATE SCHEMA evil`))
	for _, typ := range []string{"bigint", "text"} {
		require.NoError(t, exec(`CREATE FUNCTION evil.yes(a `+typ+`, b `+typ+`) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true'`))
		require.NoError(t, exec(`CREATE FUNCTION evil.no(a `+typ+`, b `+typ+`) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT false'`))
		require.NoError(t, exec(`CREATE OPERATOR evil.= (LEFTARG = `+typ+`, RIGHTARG = `+typ+`, FUNCTION = evil.yes)`))
		require.NoError(t, exec(`CREATE OPERATOR evil.<> (LEFTARG = `+typ+`, RIGHTARG = `+typ+`, FUNCTION = evil.no)`))
	}
	require.NoError(t, exec(`SELECT fencelock.advance('r', 5, 'a')`))
	require.NoError(t, exec(`BEGIN; SELECT fencelock.open('r', 5, 'a', 'k1'); SELECT fencelock.close('r', 5, 'a', 'k1'); COMMIT`))
	require.NoError(t, exec(`SET search_path = evil, pg_catalog`))
	// The hostile operators are live in this session.
	var yes bool
	require.NoError(t, conn.QueryRowContext(ctx, `SELECT 1::bigint = 2::bigint`).Scan(&yes))
	require.True(t, yes, "the hostile = is not in effect; the test proves nothing")

	tx := func(stmts ...string) error {
		if err := exec("BEGIN"); err != nil {
			return err
		}
		defer exec("ROLLBACK") //nolint:errcheck
		for _, q := range stmts {
			if err := exec(q); err != nil {
				return err
			}
		}
		return nil
	}
	for _, c := range []struct{ what, q, code string }{
		{"open, lower token", `SELECT fencelock.open('r', 4, 'a')`, "FL001"},
		{"open, other holder", `SELECT fencelock.open('r', 5, 'b')`, "FL001"},
		{"open, applied key", `SELECT fencelock.open('r', 5, 'a', 'k1')`, "FL003"},
		{"close, lower token", `SELECT fencelock.close('r', 4, 'a')`, "FL001"},
		{"close, other holder", `SELECT fencelock.close('r', 5, 'b')`, "FL001"},
		{"close, applied key", `SELECT fencelock.close('r', 5, 'a', 'k1')`, "FL003"},
	} {
		assert.ErrorContains(t, tx(c.q), c.code, c.what)
	}
	// And the right claim still passes.
	assert.NoError(t, tx(`SELECT fencelock.open('r', 5, 'a', 'k2')`, `SELECT fencelock.close('r', 5, 'a', 'k2')`))
}
