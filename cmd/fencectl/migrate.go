package main

import (
	"context"
	"fmt"

	"github.com/pressly/goose/v3"
	"github.com/spf13/cobra"

	"github.com/fencelock/fencelock/migrations"
)

func (a *app) migrateCmd() *cobra.Command {
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply every pending fencelock migration",
		Long: `Apply every pending fencelock migration (schema fencelock, version table
` + migrations.VersionTable + `). Two processes migrating at once take turns.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			db, err := a.openSessionDB(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			sdb := db.sqlDB()
			defer sdb.Close()
			if err := migrations.Up(cmd.Context(), sdb); err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, "fencelock schema is up to date")
			return nil
		},
	}
	var forceDown bool
	down := &cobra.Command{
		Use:   "down",
		Short: "Remove the fencelock schema (tokens, keys, runs, protect triggers)",
		Long: `Roll back every fencelock migration: the schema fencelock and everything in
it (tokens, applied keys, runs, the protect triggers on your tables) is
dropped. Guarded writers stop working until 'migrate up' runs again. While
tables are protected (pgfence Protect) it refuses and names them; --force
drops their triggers too.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			db, err := a.openSessionDB(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			sdb := db.sqlDB()
			defer sdb.Close()
			var opts []migrations.Option
			if forceDown {
				opts = append(opts, migrations.Force())
			}
			if err := migrations.Down(cmd.Context(), sdb, opts...); err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, "fencelock schema removed")
			return nil
		},
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "List the fencelock migrations and whether each is applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.checkOutput(); err != nil {
				return err
			}
			db, err := openDB(cmd.Context(), a.db(), a.timeout)
			if err != nil {
				return err
			}
			defer db.Close()
			sdb := db.sqlDB()
			defer sdb.Close()
			st, err := migrations.Status(cmd.Context(), sdb)
			if err != nil {
				return err
			}
			return a.printMigrations(st)
		},
	}
	down.Flags().BoolVar(&forceDown, "force", false, "also drop the protect triggers on your tables")
	for _, c := range []*cobra.Command{up, down, status} {
		a.dbFlag(c)
	}
	a.outputFlag(status)
	return group("migrate", "Install, remove or list the fencelock schema (goose migrations)", up, down, status)
}

// openSessionDB opens the database for up and down, which need a session:
// goose serialises migrations with a session advisory lock, which a
// transaction pooler would take on one server connection and release on
// another (or never).
func (a *app) openSessionDB(ctx context.Context) (*dbConn, error) {
	db, err := openDB(ctx, a.db(), a.timeout)
	if err != nil {
		return nil, err
	}
	proof, err := sharedBackend(ctx, db)
	if err == nil && proof != "" {
		db.Close()
		return nil, fmt.Errorf("%s goes through a transaction pooler (%s): migrations need a session for goose's lock; give the address of Postgres itself", db.display, proof)
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
