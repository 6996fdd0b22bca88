package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pressly/goose/v3"
	"github.com/spf13/cobra"

	"github.com/fencelock/fencelock/migrations"
)

func (a *app) migrateCmd() *cobra.Command {
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply every pending fencelock migration, and say which",
		Long: `Apply every pending fencelock migration (schema fencelock, version table
` + migrations.VersionTable + `), and say which versions were applied, or that
none was pending. A schema installed without the version table (the goose
CLI without -table) is recorded, not changed. Two processes migrating at
once take turns.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			db, err := a.openSessionDB(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			return a.migrateUp(cmd.Context(), db)
		},
	}
	var force, yes, unprotect bool
	down := &cobra.Command{
		Use:   "down --force",
		Short: "Remove the fencelock schema: every token, applied key and run (says what, asks unless --yes)",
		Long: `Roll back every fencelock migration: the schema fencelock and everything in
it is dropped: the tokens (the database's newest token per resource: after
'migrate up' it accepts the first token it sees again, a paused holder's
too), the applied idempotency keys (a batch retried later is applied
again) and the runs. Guarded writers fail until 'migrate up' runs again.
Hence --force, a summary of what is dropped, and a confirmation unless
--yes. While tables are protected (pgfence Protect) it refuses and names
them; --unprotect drops their triggers too (they then accept unfenced
writes).`,
		Example: "  fencectl migrate down --force --db \"$DATABASE_URL\"\n  fencectl migrate down --force --yes --unprotect",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !force {
				return usageErrorf("down drops schema fencelock with every token, applied key and run (guarded writers fail until 'migrate up'): add --force")
			}
			db, err := a.openSessionDB(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			return a.migrateDown(cmd.Context(), db, yes, unprotect)
		},
	}
	down.Flags().BoolVar(&force, "force", false, "required: drop the schema and the tokens in it")
	down.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	down.Flags().BoolVar(&unprotect, "unprotect", false, "also drop the protect triggers on your tables (they then accept unfenced writes)")
	status := &cobra.Command{
		Use:   "status",
		Short: "List the fencelock migrations and whether each is applied",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.checkOutput(); err != nil {
				return err
			}
			db, err := openDB(cmd.Context(), a.dbSrc(), a.timeout)
			if err != nil {
				return err
			}
			defer db.Close()
			sdb := db.sqlDB()
			defer sdb.Close()
			st, err := migrations.Status(cmd.Context(), sdb, quiet())
			if err != nil {
				return db.explain(err)
			}
			return a.printMigrations(st)
		},
	}
	for _, c := range []*cobra.Command{up, down, status} {
		a.dbFlag(c)
	}
	a.outputFlag(status)
	return group("migrate", "Install, remove or list the fencelock schema (goose migrations)", up, down, status)
}

// migrateUp runs migrations.Up and says what changed: the versions it
// applied, the versions it recorded (a schema installed without the
// version table), or nothing.
func (a *app) migrateUp(ctx context.Context, db *dbConn) error {
	sdb := db.sqlDB()
	defer sdb.Close()
	// A schema Up refuses makes Status fail too: Up's error says why.
	before, _ := migrations.Status(ctx, sdb, quiet())
	recorded := db.recordedVersions(ctx)
	if err := migrations.Up(ctx, sdb, quiet()); err != nil {
		return db.explainAs(opMigrate, err)
	}
	after, err := migrations.Status(ctx, sdb, quiet())
	if err != nil {
		return db.explain(err)
	}
	was := map[int64]bool{}
	for _, s := range before {
		was[s.Source.Version] = s.State == goose.StateApplied
	}
	var applied, adopted []string
	for _, s := range after {
		v, name := s.Source.Version, migrationName(s)
		switch {
		case s.State != goose.StateApplied:
		case !was[v]:
			applied = append(applied, name)
		case !recorded[v]:
			adopted = append(adopted, name)
		}
	}
	where := fmt.Sprintf("database %q at %s", db.cfg.ConnConfig.Database, db.display)
	latest := "none"
	if len(after) > 0 {
		latest = migrationName(after[len(after)-1])
	}
	if len(adopted) > 0 {
		fmt.Fprintf(a.stdout, "recorded %s in %s: the schema in %s was installed without it (nothing in it changed)\n",
			strings.Join(adopted, ", "), migrations.VersionTable, where)
	}
	switch {
	case len(applied) > 0:
		fmt.Fprintf(a.stdout, "applied %s to %s: the fencelock schema is at %s\n", strings.Join(applied, ", "), where, latest)
	case len(adopted) == 0:
		fmt.Fprintf(a.stdout, "nothing to apply: the fencelock schema in %s is at %s (all %d migrations applied)\n", where, latest, len(after))
	}
	return nil
}

func migrationName(s *goose.MigrationStatus) string {
	name := s.Source.Path
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	return name
}

// recordedVersions are the versions the version table records as applied
// (none when it does not exist).
func (c *dbConn) recordedVersions(ctx context.Context) map[int64]bool {
	out := map[int64]bool{}
	rows, err := c.pool.Query(ctx, `SELECT version_id FROM `+migrations.VersionTable+` WHERE version_id > 0 AND is_applied`)
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		if rows.Scan(&v) == nil {
			out[v] = true
		}
	}
	return out
}

// migrateDown says what dropping the schema loses, asks unless yes, and
// drops it.
func (a *app) migrateDown(ctx context.Context, db *dbConn, yes, unprotect bool) error {
	where := fmt.Sprintf("database %q at %s", db.cfg.ConnConfig.Database, db.display)
	sum, err := db.schemaContents(ctx)
	if err != nil {
		return db.explainAs(opMigrate, err)
	}
	if !sum.exists {
		fmt.Fprintf(a.stdout, "nothing to drop: %s has no fencelock schema\n", where)
		return nil
	}
	if len(sum.protected) > 0 && !unprotect {
		return fmt.Errorf("%s: tables %s are protected by pgfence's Protect, and dropping the schema would leave them unfenced: nothing was changed; fix: unprotect them first (pgfence Store.Unprotect), or add --unprotect to drop their triggers with the schema",
			where, strings.Join(sum.protected, ", "))
	}
	what := sum.describe()
	if unprotect && len(sum.protected) > 0 {
		what += "; and the protect triggers on " + strings.Join(sum.protected, ", ") + " (they then accept unfenced writes)"
	}
	fmt.Fprintf(a.stdout, "This drops schema fencelock from %s: %s.\n", where, what)
	fmt.Fprintln(a.stdout, "Guarded writers fail until 'fencectl migrate up' runs again; then the database accepts the first token it sees per resource, a paused holder's too, and applies retried batches again.")
	if !yes {
		if err := a.confirm("Drop it?"); err != nil {
			return err
		}
	}
	sdb := db.sqlDB()
	defer sdb.Close()
	opts := []migrations.Option{quiet()}
	if unprotect {
		opts = append(opts, migrations.Force())
	}
	if err := migrations.Down(ctx, sdb, opts...); err != nil {
		var pe *migrations.ProtectedError
		if errors.As(err, &pe) {
			return fmt.Errorf("%s: tables %s were protected in the meantime: nothing was changed; fix: unprotect them, or add --unprotect",
				where, strings.Join(pe.Tables, ", "))
		}
		return db.explainAs(opMigrate, err)
	}
	fmt.Fprintf(a.stdout, "dropped schema fencelock from %s (%s); %s is kept, empty\n", where, sum.short(), migrations.VersionTable)
	return nil
}

// schemaContents is what schema fencelock holds: rows per table, open
// runs, and the tables its protect triggers guard.
type schemaContents struct {
	exists    bool
	tables    []string         // in schema order
	rows      map[string]int64 // per table
	openRuns  int64
	protected []string
}

func (c *dbConn) schemaContents(ctx context.Context) (*schemaContents, error) {
	s := &schemaContents{rows: map[string]int64{}}
	if err := c.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'fencelock')`).Scan(&s.exists); err != nil || !s.exists {
		return s, err
	}
	rows, err := c.pool.Query(ctx, `SELECT relname FROM pg_class WHERE relnamespace = 'fencelock'::regnamespace AND relkind IN ('r', 'p') ORDER BY relname`)
	if err != nil {
		return nil, err
	}
	s.tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	// The tokens first: they are what dropping the schema costs most.
	order := map[string]int{"fence": 1, "applied": 2, "runs": 3}
	sort.SliceStable(s.tables, func(i, j int) bool {
		oi, oj := order[s.tables[i]], order[s.tables[j]]
		if oi == 0 {
			oi = 99
		}
		if oj == 0 {
			oj = 99
		}
		return oi < oj
	})
	for _, t := range s.tables {
		var n int64
		if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.`+pgx.Identifier{t}.Sanitize()).Scan(&n); err != nil {
			return nil, err
		}
		s.rows[t] = n
		if t == "runs" {
			if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.runs WHERE NOT finished`).Scan(&s.openRuns); err != nil {
				return nil, err
			}
		}
	}
	// The triggers migrations.Down looks for: on user tables, calling a
	// fencelock function.
	rows, err = c.pool.Query(ctx, `
SELECT DISTINCT format('%I.%I', tn.nspname, cl.relname)
  FROM pg_trigger t
  JOIN pg_class cl ON cl.oid = t.tgrelid
  JOIN pg_namespace tn ON tn.oid = cl.relnamespace
  JOIN pg_proc p ON p.oid = t.tgfoid
 WHERE p.pronamespace = 'fencelock'::regnamespace AND cl.relnamespace <> 'fencelock'::regnamespace AND NOT t.tgisinternal
 ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	s.protected, err = pgx.CollectRows(rows, pgx.RowTo[string])
	return s, err
}

// describe names what each table holds, in words an operator acts on.
func (s *schemaContents) describe() string {
	var parts []string
	for _, t := range s.tables {
		n := s.rows[t]
		switch t {
		case "fence":
			parts = append(parts, fmt.Sprintf("the tokens of %d fenced resources (fencelock.fence)", n))
		case "applied":
			parts = append(parts, fmt.Sprintf("%d applied idempotency keys (fencelock.applied)", n))
		case "runs":
			parts = append(parts, fmt.Sprintf("%d runs, %d of them open (fencelock.runs)", n, s.openRuns))
		case "outbox":
			parts = append(parts, fmt.Sprintf("%d effects not yet delivered (fencelock.outbox)", n))
		default:
			parts = append(parts, fmt.Sprintf("%d rows in fencelock.%s", n, t))
		}
	}
	if len(parts) == 0 {
		return "no tables"
	}
	return strings.Join(parts, ", ")
}

// short is describe in a few words, for the closing line.
func (s *schemaContents) short() string {
	var parts []string
	for _, t := range s.tables {
		parts = append(parts, fmt.Sprintf("%d rows of fencelock.%s", s.rows[t], t))
	}
	return strings.Join(parts, ", ")
}

// openSessionDB opens the database for up and down, which need a session:
// goose serialises migrations with a session advisory lock, which a
// transaction pooler would take on one server connection and release on
// another (or never).
func (a *app) openSessionDB(ctx context.Context) (*dbConn, error) {
	db, err := openDB(ctx, a.dbSrc(), a.timeout)
	if err != nil {
		return nil, err
	}
	proof, err := sharedBackend(ctx, db)
	if err == nil && proof != "" {
		db.Close()
		return nil, fmt.Errorf("%s goes through a transaction pooler (%s): migrations need a session for goose's lock; fix: give the address of Postgres itself (%s)", db.display, proof, db.src.flag)
	}
	return db, nil
}

type migrationJSON struct {
	Version   int64  `json:"version"`
	File      string `json:"file"`
	State     string `json:"state"`
	AppliedAt string `json:"applied_at,omitempty"`
}

func (a *app) printMigrations(st []*goose.MigrationStatus) error {
	var js []migrationJSON
	var rows [][]string
	for _, s := range st {
		at := ""
		if !s.AppliedAt.IsZero() {
			at = timeOrDash(s.AppliedAt)
		}
		js = append(js, migrationJSON{s.Source.Version, s.Source.Path, string(s.State), at})
		if at == "" {
			at = "-"
		}
		rows = append(rows, []string{fmt.Sprint(s.Source.Version), string(s.State), at, s.Source.Path})
	}
	if a.json() {
		if js == nil {
			js = []migrationJSON{}
		}
		return a.printJSON(js)
	}
	return a.table([]string{"VERSION", "STATE", "APPLIED AT", "FILE"}, rows)
}

// quiet keeps the migrations' own log lines (an adopted schema, goose's
// progress) off stderr: fencectl says what changed itself.
func quiet() migrations.Option { return migrations.WithLogger(slog.New(slog.DiscardHandler)) }
