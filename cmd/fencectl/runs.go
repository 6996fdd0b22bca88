package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func (a *app) runsCmd() *cobra.Command {
	var resource, state string
	var limit int
	list := &cobra.Command{
		Use:     "list",
		Short:   "List resumable runs: resource, run key, token, cursor, finished",
		Example: "  fencectl runs list --state open\n  fencectl runs list --resource stock-sync:eu -o json",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.checkOutput(); err != nil {
				return err
			}
			where := map[string]string{"all": "true", "open": "NOT finished", "finished": "finished"}[state]
			if where == "" {
				return usageErrorf("--state %q: want all, open or finished", state)
			}
			if limit <= 0 {
				return usageErrorf("--limit %d: want a positive number", limit)
			}
			return a.runsList(cmd.Context(), resource, where, limit)
		},
	}
	a.dbFlag(list)
	a.outputFlag(list)
	list.Flags().StringVar(&resource, "resource", "", "only this resource's runs")
	list.Flags().StringVar(&state, "state", "all", "all, open (not finished) or finished")
	list.Flags().IntVar(&limit, "limit", 100, "at most this many runs, newest first")

	prune := a.pruneCmd("runs", "finished runs",
		`Delete finished runs whose finish is older than --older-than. A run key
used again after its row is pruned starts over from the beginning: keep the
age well above the longest time a finished run can be retried. Open runs
are never pruned (they are how a new holder resumes).`,
		`DELETE FROM fencelock.runs WHERE finished AND finished_at < now() - $1 * interval '1 microsecond' AND ($2 = '' OR resource = $2)`,
		`SELECT count(*) FROM fencelock.runs WHERE finished AND finished_at < now() - $1 * interval '1 microsecond' AND ($2 = '' OR resource = $2)`)
	return group("runs", "List or prune resumable runs (fencelock.runs)", list, prune)
}

// runsList prints up to limit runs matching where (a condition on
// fencelock.runs of runsCmd's own making, never user text) and resource
// ("": every resource), newest first.
func (a *app) runsList(ctx context.Context, resource, where string, limit int) error {
	db, err := openDB(ctx, a.dbSrc(), a.timeout)
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := db.pool.Query(ctx, `
SELECT resource, run_key, token, cursor, finished, finished_at, updated_at
FROM fencelock.runs
WHERE `+where+` AND ($1 = '' OR resource = $1)
ORDER BY updated_at DESC, resource, run_key
LIMIT $2`, resource, limit)
	if err != nil {
		return db.explain(err)
	}
	defer rows.Close()
	out := []runJSON{}
	for rows.Next() {
		var r runJSON
		var fin *time.Time
		if err := rows.Scan(&r.Resource, &r.RunKey, &r.Token, &r.Cursor, &r.Finished, &fin, &r.Updated); err != nil {
			return err
		}
		if fin != nil {
			r.FinishedAt = fin
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return db.explain(err)
	}
	if a.json() {
		return a.printJSON(out)
	}
	var tr [][]string
	for _, r := range out {
		fin := "-"
		if r.FinishedAt != nil {
			fin = timeOrDash(*r.FinishedAt)
		}
		cursor := r.Cursor
		if cursor == "" {
			cursor = "-"
		}
		tr = append(tr, []string{r.Resource, r.RunKey, fmt.Sprint(r.Token), cursor, fmt.Sprint(r.Finished), fin, timeOrDash(r.Updated)})
	}
	return a.table([]string{"RESOURCE", "RUN KEY", "TOKEN", "CURSOR", "FINISHED", "FINISHED AT", "UPDATED"}, tr)
}

type runJSON struct {
	Resource   string     `json:"resource"`
	RunKey     string     `json:"run_key"`
	Token      int64      `json:"token"`
	Cursor     string     `json:"cursor"`
	Finished   bool       `json:"finished"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	Updated    time.Time  `json:"updated_at"`
}

// pruneCmd builds "runs prune" and "keys prune": the same age rule as
// pgfence.Store.Prune, one table at a time.
func (a *app) pruneCmd(group, what, long, del, count string) *cobra.Command {
	var olderThan, resource string
	var dryRun bool
	c := &cobra.Command{
		Use:     "prune --older-than AGE",
		Short:   "Delete " + what + " older than AGE",
		Long:    long,
		Example: "  fencectl " + group + " prune --older-than 30d\n  fencectl " + group + " prune --older-than 720h --dry-run",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan == "" {
				return usageErrorf("give --older-than AGE (e.g. 30d): there is no default, since a retry after its %s is pruned is applied again", what)
			}
			age, err := parseAge(olderThan)
			if err != nil {
				return err
			}
			db, err := openDB(cmd.Context(), a.dbSrc(), a.timeout)
			if err != nil {
				return err
			}
			defer db.Close()
			q, verb := del, "deleted"
			if dryRun {
				q, verb = count, "would delete"
			}
			var n int64
			if dryRun {
				err = db.pool.QueryRow(cmd.Context(), q, age.Microseconds(), resource).Scan(&n)
			} else {
				var tag interface{ RowsAffected() int64 }
				tag, err = db.pool.Exec(cmd.Context(), q, age.Microseconds(), resource)
				if err == nil {
					n = tag.RowsAffected()
				}
			}
			if err != nil {
				return db.explainAs(opPrune, err)
			}
			fmt.Fprintf(a.stdout, "%s %d %s older than %v\n", verb, n, what, age)
			return nil
		},
	}
	a.dbFlag(c)
	c.Flags().StringVar(&olderThan, "older-than", "", "age: 30d, 720h, 90m (required)")
	c.Flags().StringVar(&resource, "resource", "", "only this resource")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "count what would be deleted, delete nothing")
	return c
}
