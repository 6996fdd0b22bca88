package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
)

// A schema installed without a record in VersionTable (the goose CLI run
// without -table fencelock_db_version records it in goose_db_version) is
// invisible to goose: it reports every migration pending, and applying
// 00001 fails on CREATE SCHEMA. Up and Status therefore look at what the
// fencelock schema really holds and compare it with what the embedded
// migrations create: when it is exactly the state after migrations 1..k,
// Up records those versions (adopts the schema) and Status reports them
// applied; anything else is one error with a fix that works as written.

// schemaObjects is what the fencelock schema holds that the migrations
// create: table name -> column names in order, function name -> body.
type schemaObjects struct {
	tables    map[string]string // comma-separated column names
	functions map[string]string // prosrc, trimmed
}

func newSchemaObjects() schemaObjects {
	return schemaObjects{tables: map[string]string{}, functions: map[string]string{}}
}

func (o schemaObjects) clone() schemaObjects {
	c := newSchemaObjects()
	for k, v := range o.tables {
		c.tables[k] = v
	}
	for k, v := range o.functions {
		c.functions[k] = v
	}
	return c
}

func (o schemaObjects) empty() bool { return len(o.tables) == 0 && len(o.functions) == 0 }

// diff says how got differs from want, or "" when they are the same. It
// names the first difference in a stable order.
func (want schemaObjects) diff(got schemaObjects) string {
	var out []string
	for _, name := range sortedKeys(want.tables) {
		g, ok := got.tables[name]
		switch {
		case !ok:
			out = append(out, "table fencelock."+name+" is missing")
		case g != want.tables[name]:
			out = append(out, fmt.Sprintf("table fencelock.%s has columns (%s), the migrations create (%s)", name, g, want.tables[name]))
		}
	}
	for _, name := range sortedKeys(got.tables) {
		if _, ok := want.tables[name]; !ok {
			out = append(out, "table fencelock."+name+" is not created by these migrations")
		}
	}
	for _, name := range sortedKeys(want.functions) {
		g, ok := got.functions[name]
		switch {
		case !ok:
			out = append(out, "function fencelock."+name+" is missing")
		case g != want.functions[name]:
			out = append(out, "function fencelock."+name+" differs from the migrations' version")
		}
	}
	for _, name := range sortedKeys(got.functions) {
		if _, ok := want.functions[name]; !ok {
			out = append(out, "function fencelock."+name+" is not created by these migrations")
		}
	}
	if len(out) == 0 {
		return ""
	}
	if len(out) > 3 {
		out = append(out[:3], fmt.Sprintf("%d more differences", len(out)-3))
	}
	return strings.Join(out, "; ")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

var (
	createTableRE = regexp.MustCompile(`(?i)CREATE\s+TABLE\s+fencelock\.(\w+)\s*\(`)
	dropTableRE   = regexp.MustCompile(`(?i)DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?fencelock\.(\w+)`)
	createFuncRE  = regexp.MustCompile(`(?is)CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+fencelock\.(\w+)\s*\(.*?\bAS\s+\$\$(.*?)\$\$`)
	dropFuncRE    = regexp.MustCompile(`(?i)DROP\s+FUNCTION\s+(?:IF\s+EXISTS\s+)?fencelock\.(\w+)`)
)

// migrationState is the schema once migration version (and all before it)
// is applied.
type migrationState struct {
	version int64
	objects schemaObjects
}

// expectedStates reads the Up sections of the embedded migrations, in
// version order, and returns the schema after each. It knows the
// statements the migrations use (CREATE TABLE, CREATE [OR REPLACE]
// FUNCTION, DROP TABLE, DROP FUNCTION); TestExpectedMatchesInstalled fails
// when a migration changes the schema some other way.
func expectedStates(sources []*goose.Source) ([]migrationState, error) {
	cur := newSchemaObjects()
	var states []migrationState
	for _, src := range sources {
		b, err := fs.ReadFile(FS(), src.Path)
		if err != nil {
			return nil, fmt.Errorf("migrations: read %s: %w", src.Path, err)
		}
		up := string(b)
		if i := strings.Index(up, "-- +goose Down"); i >= 0 {
			up = up[:i]
		}
		up = stripLineComments(up)
		for _, m := range dropTableRE.FindAllStringSubmatch(up, -1) {
			delete(cur.tables, m[1])
		}
		for _, m := range dropFuncRE.FindAllStringSubmatch(up, -1) {
			delete(cur.functions, m[1])
		}
		for _, loc := range createTableRE.FindAllStringSubmatchIndex(up, -1) {
			name := up[loc[2]:loc[3]]
			cols, err := columnNames(up[loc[1]:])
			if err != nil {
				return nil, fmt.Errorf("migrations: %s: table %s: %w", src.Path, name, err)
			}
			cur.tables[name] = cols
		}
		for _, m := range createFuncRE.FindAllStringSubmatch(up, -1) {
			cur.functions[m[1]] = strings.TrimSpace(m[2])
		}
		states = append(states, migrationState{version: src.Version, objects: cur.clone()})
	}
	return states, nil
}

// stripLineComments drops "--" comments that start a line (the migrations'
// prose), so that names quoted in them are not taken for statements.
// Function bodies keep theirs: they are indented.
func stripLineComments(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "--") {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// columnNames returns the column names of a CREATE TABLE body that starts
// just after its opening parenthesis, comma-separated.
func columnNames(body string) (string, error) {
	depth, start := 0, 0
	var items []string
	for i, r := range body {
		switch r {
		case '(':
			depth++
		case ')':
			if depth == 0 {
				items = append(items, body[start:i])
				var cols []string
				for _, it := range items {
					f := strings.Fields(it)
					if len(f) == 0 {
						continue
					}
					switch strings.ToUpper(f[0]) {
					case "PRIMARY", "CHECK", "UNIQUE", "CONSTRAINT", "FOREIGN", "EXCLUDE":
						continue
					}
					cols = append(cols, f[0])
				}
				return strings.Join(cols, ","), nil
			}
			depth--
		case ',':
			if depth == 0 {
				items = append(items, body[start:i])
				start = i + 1
			}
		}
	}
	return "", errors.New("no closing parenthesis")
}

// installedObjects reads what the fencelock schema holds, and whether it
// exists at all.
func installedObjects(ctx context.Context, q database.DBTxConn) (schemaObjects, bool, error) {
	o := newSchemaObjects()
	var exists bool
	if err := q.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'fencelock')`).Scan(&exists); err != nil {
		return o, false, fmt.Errorf("migrations: inspect schema fencelock: %w", err)
	}
	if !exists {
		return o, false, nil
	}
	rows, err := q.QueryContext(ctx, `
SELECT c.relname, string_agg(a.attname, ',' ORDER BY a.attnum)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE n.nspname = 'fencelock' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
 GROUP BY c.relname`)
	if err != nil {
		return o, true, fmt.Errorf("migrations: inspect schema fencelock: %w", err)
	}
	for rows.Next() {
		var name, cols string
		if err := rows.Scan(&name, &cols); err != nil {
			rows.Close()
			return o, true, fmt.Errorf("migrations: inspect schema fencelock: %w", err)
		}
		o.tables[name] = cols
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return o, true, fmt.Errorf("migrations: inspect schema fencelock: %w", err)
	}
	rows, err = q.QueryContext(ctx, `
SELECT p.proname, p.prosrc, count(*) OVER (PARTITION BY p.proname)
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'fencelock'`)
	if err != nil {
		return o, true, fmt.Errorf("migrations: inspect schema fencelock: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, src string
		var overloads int
		if err := rows.Scan(&name, &src, &overloads); err != nil {
			return o, true, fmt.Errorf("migrations: inspect schema fencelock: %w", err)
		}
		if overloads > 1 {
			// The migrations create one function per name: an overload
			// is someone else's, and never matches.
			src = "overloaded " + strconv.Itoa(overloads) + " times"
		}
		o.functions[name] = strings.TrimSpace(src)
	}
	if err := rows.Err(); err != nil {
		return o, true, fmt.Errorf("migrations: inspect schema fencelock: %w", err)
	}
	return o, true, nil
}

// appliedVersions returns the versions a goose version table records as
// applied (its newest row per version decides), and whether the table
// exists. Version 0, goose's marker row, is left out.
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
	list, err := store.ListMigrations(ctx, q)
	if err != nil {
		return nil, true, fmt.Errorf("migrations: read %s: %w", table, err)
	}
	applied := map[int64]time.Time{}
	seen := map[int64]bool{}
	for _, m := range list { // newest row first
		if seen[m.Version] {
			continue
		}
		seen[m.Version] = true
		if m.IsApplied && m.Version > 0 {
			applied[m.Version] = time.Time{}
		}
	}
	for v := range applied {
		if r, err := store.GetMigration(ctx, q, v); err == nil {
			applied[v] = r.Timestamp
		}
	}
	return applied, true, nil
}

// unrecorded is what inspect finds about a schema VersionTable does not
// record.
type unrecorded struct {
	adopt   []int64             // versions the schema matches (1..k), nil if none
	legacy  map[int64]time.Time // what goose_db_version records of ours, if anything
	problem string              // why it cannot be adopted, "" if it can
}

// inspect compares the database with VersionTable. It returns nil when
// there is nothing unusual: the schema is absent and unrecorded (Up
// installs it) or present and recorded (goose knows it). Otherwise the
// schema exists without a record (adoptable or not), or the record exists
// without a schema.
func inspect(ctx context.Context, q database.DBTxConn, sources []*goose.Source) (*unrecorded, error) {
	got, exists, err := installedObjects(ctx, q)
	if err != nil {
		return nil, err
	}
	ours, _, err := appliedVersions(ctx, q, VersionTable)
	if err != nil {
		return nil, err
	}
	switch {
	case !exists && len(ours) == 0, exists && len(ours) > 0:
		return nil, nil
	case !exists:
		return nil, fmt.Errorf("%w: %s records versions %s: delete the records (DELETE FROM %s WHERE version_id > 0) and run Up again",
			ErrRecordedMissing, VersionTable, versionList(ours), VersionTable)
	}
	u := &unrecorded{}
	if legacy, _, err := appliedVersions(ctx, q, goose.DefaultTablename); err == nil {
		u.legacy = map[int64]time.Time{}
		for _, s := range sources {
			if t, ok := legacy[s.Version]; ok {
				u.legacy[s.Version] = t
			}
		}
	}
	states, err := expectedStates(sources)
	if err != nil {
		return nil, err
	}
	for k := len(states) - 1; k >= 0; k-- {
		if states[k].objects.diff(got) == "" {
			for _, s := range states[:k+1] {
				u.adopt = append(u.adopt, s.version)
			}
			return u, nil
		}
	}
	if got.empty() {
		u.problem = "it holds none of fencelock's tables or functions"
	} else if len(states) > 0 {
		u.problem = states[len(states)-1].objects.diff(got)
	}
	return u, nil
}

func versionList[T any](m map[int64]T) string {
	vs := make([]int64, 0, len(m))
	for v := range m {
		vs = append(vs, v)
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i] < vs[j] })
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(s, ", ")
}

// unrecordedError is the error for a schema that cannot be adopted.
func (u *unrecorded) err() error {
	return fmt.Errorf("%w, and it does not match these migrations (%s): it was installed by hand or by another fencelock version; "+
		"drop it (DROP SCHEMA fencelock CASCADE; this also drops the stored tokens and the Protect triggers) and run Up again, with no fenced writer running in between",
		ErrUnrecorded, u.problem)
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
		if err := store.Insert(ctx, tx, database.InsertRequest{Version: 0}); err != nil {
			return err
		}
	}
	for _, v := range versions {
		if err := store.Insert(ctx, tx, database.InsertRequest{Version: v}); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// adopt records a matching unrecorded schema in VersionTable, under the
// migration lock so that concurrent Ups do not record it twice.
func adopt(ctx context.Context, db *sql.DB, sources []*goose.Source, cfg *config) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	defer conn.Close()
	locker, err := newLocker()
	if err != nil {
		return err
	}
	if err := locker.SessionLock(ctx, conn); err != nil {
		return fmt.Errorf("migrations: up: lock: %w", err)
	}
	defer func() { _ = locker.SessionUnlock(context.WithoutCancel(ctx), conn) }()

	u, err := inspect(ctx, conn, sources)
	if err != nil || u == nil {
		return err
	}
	if u.adopt == nil {
		return u.err()
	}
	if err := record(ctx, conn, u.adopt); err != nil {
		return fmt.Errorf("migrations: up: record the existing schema in %s: %w", VersionTable, err)
	}
	from := "no version table records it"
	if len(u.legacy) > 0 {
		from = fmt.Sprintf("%s records versions %s: the goose CLI was probably run without -table %s; those rows are left as they are",
			goose.DefaultTablename, versionList(u.legacy), VersionTable)
	}
	last := u.adopt[len(u.adopt)-1]
	cfg.logger.Printf("migrations: schema fencelock was installed without a record in %s (%s); it matches migrations 1 to %d, recorded them in %s",
		VersionTable, from, last, VersionTable)
	return nil
}
