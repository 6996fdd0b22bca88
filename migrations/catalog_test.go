package migrations_test

import (
	"database/sql"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// catalogQueries read what the migrations make, one line per object and
// property, with every name spelled out (no oid), so that two databases
// compare line by line: the schema, its relations (tables, indexes,
// sequences) with their options and ACLs, columns with their types,
// defaults and column grants, constraints, indexes, triggers (on the
// schema's tables and those that call its functions), policies, and every
// function whole (pg_get_functiondef: arguments, volatility, SECURITY
// DEFINER, SET clauses, body) with its ACL; each with its owner and
// COMMENT. An ACL lists what PUBLIC and the owner hold (see acl).
var catalogQueries = []string{
	`SELECT format('schema %s owner=%s acl=%s comment=%s', n.nspname, pg_get_userbyid(n.nspowner), ` + acl("n.nspacl", "'n'", "n.nspowner") + `,
	               obj_description(n.oid, 'pg_namespace'))
	   FROM pg_namespace n WHERE n.nspname = 'fencelock'`,
	`SELECT format('relation %s kind=%s persistence=%s owner=%s options=%s acl=%s rowsecurity=%s comment=%s',
	               c.relname, c.relkind, c.relpersistence, pg_get_userbyid(c.relowner), c.reloptions, ` + acl("c.relacl", "(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END)::\"char\"", "c.relowner") + `,
	               c.relrowsecurity, obj_description(c.oid, 'pg_class'))
	   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'fencelock'`,
	`SELECT format('column %s.%s #%s %s notnull=%s identity=%s generated=%s default=%s acl=%s comment=%s',
	               c.relname, a.attname, a.attnum, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
	               a.attgenerated, pg_get_expr(d.adbin, d.adrelid), ` + acl("a.attacl", "", "c.relowner") + `, col_description(c.oid, a.attnum))
	   FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	   LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
	  WHERE n.nspname = 'fencelock' AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p', 'v', 'm', 'f')`,
	`SELECT format('constraint %s.%s %s deferrable=%s deferred=%s', c.relname, k.conname, pg_get_constraintdef(k.oid),
	               k.condeferrable, k.condeferred)
	   FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	  WHERE n.nspname = 'fencelock'`,
	`SELECT format('index %s', pg_get_indexdef(i.indexrelid))
	   FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	  WHERE n.nspname = 'fencelock'`,
	`SELECT format('trigger %s enabled=%s comment=%s', pg_get_triggerdef(t.oid), t.tgenabled, obj_description(t.oid, 'pg_trigger'))
	   FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace tn ON tn.oid = c.relnamespace
	   JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_namespace pn ON pn.oid = p.pronamespace
	  WHERE NOT t.tgisinternal AND (tn.nspname = 'fencelock' OR pn.nspname = 'fencelock')`,
	`SELECT format('policy %s.%s cmd=%s permissive=%s roles=%s using=%s check=%s', c.relname, p.polname, p.polcmd,
	               p.polpermissive, p.polroles::regrole[], pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid))
	   FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	  WHERE n.nspname = 'fencelock'`,
	`SELECT format(E'function %s owner=%s acl=%s comment=%s\n%s', p.oid::regprocedure, pg_get_userbyid(p.proowner), ` + acl("p.proacl", "'f'", "p.proowner") + `,
	               obj_description(p.oid, 'pg_proc'), pg_get_functiondef(p.oid))
	   FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'fencelock'`,
}

// acl is an SQL expression for the ACL column of an object of kind
// (acldefault's letter, "" for a column: none by default) owned by owner:
// the privileges of PUBLIC and of the owner, the ones the migrations
// grant and revoke. Those of other roles are the DBA's (the application
// roles'), not the schema's.
func acl(column, kind, owner string) string {
	if kind != "" {
		column = "coalesce(" + column + ", acldefault(" + kind + ", " + owner + "))"
	}
	return "(SELECT string_agg(e.who || ':' || e.privilege_type, ',' ORDER BY e.who, e.privilege_type)" +
		" FROM (SELECT CASE WHEN x.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(x.grantee) END AS who, x.privilege_type" +
		" FROM aclexplode(" + column + ") x WHERE x.grantee IN (0, " + owner + ")) e)"
}

// catalog is the fencelock schema of db as catalogQueries read it, sorted;
// nil when the schema is absent.
func catalog(t *testing.T, db *sql.DB) []string {
	t.Helper()
	ctx := ctxT(t)
	var out []string
	for _, q := range catalogQueries {
		rows, err := db.QueryContext(ctx, q)
		require.NoError(t, err, q)
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			out = append(out, line)
		}
		require.NoError(t, rows.Err())
		rows.Close()
	}
	slices.Sort(out)
	return out
}

// catalogDiff lists the lines of a missing from b ("-") and of b missing
// from a ("+"): functions by their first line only, the rest being their
// definition.
func catalogDiff(a, b []string) []string {
	in := func(s []string, x string) bool { _, found := slices.BinarySearch(s, x); return found }
	var d []string
	for _, x := range a {
		if !in(b, x) {
			d = append(d, "- "+strings.SplitN(x, "\n", 2)[0])
		}
	}
	for _, x := range b {
		if !in(a, x) {
			d = append(d, "+ "+strings.SplitN(x, "\n", 2)[0])
		}
	}
	return d
}
