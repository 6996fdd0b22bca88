package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fencelock/fencelock/outbox"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"
)

func init() { register((*app).outboxCmd) }

func (a *app) outboxCmd() *cobra.Command {
	var dead bool
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List the effects waiting in fencelock.outbox (or the dead ones), with counts by state",
		Long: `List the rows of fencelock.outbox, oldest first: the effects that fenced
transactions recorded and no relay has delivered yet, or with --dead the
ones that failed for good (out of attempts, or refused by the receiver),
with the reason. The first line counts rows by state: due (a relay may
claim them now), waiting (backing off after a failure), claimed (a relay
holds them) and dead.`,
		Example: "  fencectl outbox list\n  fencectl outbox list --dead -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.checkOutput(); err != nil {
				return err
			}
			if limit <= 0 {
				return usageErrorf("--limit %d: want a positive number", limit)
			}
			db, err := openDB(cmd.Context(), a.dbSrc(), a.timeout)
			if err != nil {
				return err
			}
			defer db.Close()
			counts, err := outbox.Count(cmd.Context(), db.pool)
			if err != nil {
				return a.outboxError(db, err)
			}
			rows, err := outbox.List(cmd.Context(), db.pool, dead, limit)
			if err != nil {
				return a.outboxError(db, err)
			}
			if a.json() {
				if rows == nil {
					rows = []outbox.Row{}
				}
				return a.printJSON(struct {
					Counts outbox.Counts `json:"counts"`
					Rows   []outbox.Row  `json:"rows"`
				}{counts, rows})
			}
			fmt.Fprintf(a.stdout, "%d due, %d waiting, %d claimed, %d dead\n", counts.Due, counts.Waiting, counts.Claimed, counts.Dead)
			if len(rows) == 0 {
				return nil
			}
			var tr [][]string
			for _, r := range rows {
				when := timeOrDash(r.Due)
				if r.Dead != nil {
					when = timeOrDash(*r.Dead)
				}
				last := r.LastError
				if len(last) > 80 {
					last = last[:77] + "..."
				}
				if last == "" {
					last = "-"
				}
				tr = append(tr, []string{strconv.FormatInt(r.ID, 10), r.Resource, strconv.FormatInt(r.Token, 10), r.Key,
					r.Destination, strconv.Itoa(r.Attempts), when, last})
			}
			whenCol := "DUE"
			if dead {
				whenCol = "DEAD SINCE"
			}
			return a.table([]string{"ID", "RESOURCE", "TOKEN", "KEY", "DESTINATION", "ATTEMPTS", whenCol, "LAST ERROR"}, tr)
		},
	}
	a.dbFlag(list)
	a.outputFlag(list)
	list.Flags().BoolVar(&dead, "dead", false, "list the dead rows instead of the live ones")
	list.Flags().IntVar(&limit, "limit", 100, "at most this many rows, oldest first")

	var all bool
	requeue := &cobra.Command{
		Use:   "requeue (--all | ID...)",
		Short: "Make dead outbox rows due again, their attempts reset",
		Long: `Make dead rows of fencelock.outbox due again, with their attempts reset:
the rows whose IDs are given (fencectl outbox list --dead shows them), or
every dead row with --all. A running relay delivers them at its next poll.
Fix what made them fail first (the LAST ERROR column): a row that fails
again goes dead again after its attempts.`,
		Example: "  fencectl outbox requeue 17 18\n  fencectl outbox requeue --all",
		RunE: func(cmd *cobra.Command, args []string) error {
			var ids []int64
			switch {
			case all && len(args) > 0:
				return usageErrorf("give --all or IDs, not both")
			case !all && len(args) == 0:
				return usageErrorf("give the IDs of dead rows (fencectl outbox list --dead), or --all")
			}
			for _, s := range args {
				id, err := strconv.ParseInt(s, 10, 64)
				if err != nil || id <= 0 {
					return usageErrorf("%q is not a row ID (a positive number, from fencectl outbox list --dead)", s)
				}
				ids = append(ids, id)
			}
			db, err := openDB(cmd.Context(), a.dbSrc(), a.timeout)
			if err != nil {
				return err
			}
			defer db.Close()
			n, err := outbox.Requeue(cmd.Context(), db.pool, ids)
			if err != nil {
				return a.outboxError(db, err)
			}
			fmt.Fprintf(a.stdout, "requeued %d dead rows\n", n)
			if !all && n < len(ids) {
				fmt.Fprintf(a.stdout, "%d of the IDs given are not dead rows (delivered since, or never dead): left alone\n", len(ids)-n)
			}
			return nil
		},
	}
	a.dbFlag(requeue)
	requeue.Flags().BoolVar(&all, "all", false, "requeue every dead row")
	return group("outbox", "List the effects waiting for delivery, requeue dead ones (fencelock.outbox)", list, requeue)
}

// outboxError names a schema without the outbox (migration 3) as missing:
// fencectl migrate up installs it.
func (a *app) outboxError(db *dbConn, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42883" && strings.Contains(pgErr.Message, "outbox_") {
		return &schemaMissingError{src: db.src, dbname: db.cfg.ConnConfig.Database}
	}
	return db.explain(err)
}
