package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fencelock/tick"
)

func init() { register((*app).ticksCmd) }

func (a *app) ticksCmd() *cobra.Command {
	var job string
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List scheduled jobs' ticks (package tick): done, running, missed",
		Long: `List the ticks of scheduled jobs run with package tick, newest first, per
job: each tick's run (done, running, or open: left behind a newer tick) with
its token, and the ticks no instance ran (missed), as the job's ledger
records them (its last 32 runs of missed ticks).`,
		Example: "  fencectl ticks list\n  fencectl ticks list --job stock-sync -o json",
		Args:    usageArgs(cobra.NoArgs),
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
			jobs, err := readJobs(cmd.Context(), db, job, limit)
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(jobs)
			}
			return a.table([]string{"JOB", "TICK", "STATE", "TOKEN", "CURSOR", "AT"}, tickRows(jobs))
		},
	}
	a.dbFlag(list)
	a.outputFlag(list)
	list.Flags().StringVar(&job, "job", "", "only this job's ticks")
	list.Flags().IntVar(&limit, "limit", 20, "at most this many ticks per job, newest first")
	return group("ticks", "List scheduled jobs' ticks (package tick)", list)
}

// jobJSON is one job's ticks.
type jobJSON struct {
	Job            string       `json:"job"`
	Newest         *time.Time   `json:"newest,omitempty"`
	NewestFinished bool         `json:"newest_finished"`
	Ticks          []tickJSON   `json:"ticks"`
	Missed         []missedJSON `json:"missed"`
}

type tickJSON struct {
	Tick   time.Time `json:"tick"`
	State  string    `json:"state"` // done, running, open
	Token  int64     `json:"token"`
	Cursor string    `json:"cursor"`
	At     time.Time `json:"at"` // finished, or last step
}

type missedJSON struct {
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
	Count int64     `json:"count"`
	Found time.Time `json:"found"`
}

// readJobs reads the ledgers of the jobs (or of one), then their ticks'
// runs, newest first.
func readJobs(ctx context.Context, db *dbConn, only string, limit int) ([]jobJSON, error) {
	rows, err := db.pool.Query(ctx, `SELECT resource, cursor FROM fencelock.runs
WHERE run_key = $1 AND ($2 = '' OR resource = $2) ORDER BY resource`, tick.LedgerKey, only)
	if err != nil {
		return nil, db.explain(err)
	}
	jobs := []jobJSON{}
	var cursors []string
	for rows.Next() {
		var j jobJSON
		var c string
		if err := rows.Scan(&j.Job, &c); err != nil {
			return nil, err
		}
		jobs, cursors = append(jobs, j), append(cursors, c)
	}
	if err := rows.Err(); err != nil {
		return nil, db.explain(err)
	}
	for i := range jobs {
		l, err := tick.ParseLedger(cursors[i])
		if err != nil {
			return nil, fmt.Errorf("job %q: %w", jobs[i].Job, err)
		}
		if err := readTicks(ctx, db, &jobs[i], l, limit); err != nil {
			return nil, err
		}
	}
	return jobs, nil
}

func readTicks(ctx context.Context, db *dbConn, j *jobJSON, l tick.Ledger, limit int) error {
	if !l.Newest.IsZero() {
		n := l.Newest.UTC()
		j.Newest, j.NewestFinished = &n, l.Finished
	}
	j.Missed = []missedJSON{}
	for i := len(l.Missed) - 1; i >= 0; i-- {
		m := l.Missed[i]
		j.Missed = append(j.Missed, missedJSON{First: m.First.UTC(), Last: m.Last.UTC(), Count: m.Count, Found: m.Found.UTC()})
	}
	rows, err := db.pool.Query(ctx, `SELECT run_key, token, cursor, finished, coalesce(finished_at, updated_at)
FROM fencelock.runs WHERE resource = $1 AND run_key <> $2`, j.Job, tick.LedgerKey)
	if err != nil {
		return db.explain(err)
	}
	defer rows.Close()
	j.Ticks = []tickJSON{}
	for rows.Next() {
		var key string
		var fin bool
		var t tickJSON
		if err := rows.Scan(&key, &t.Token, &t.Cursor, &fin, &t.At); err != nil {
			return err
		}
		at, err := time.Parse(time.RFC3339Nano, key)
		if err != nil {
			continue // a run of the resource that is not a tick's
		}
		t.Tick, t.At = at.UTC(), t.At.UTC()
		switch {
		case fin:
			t.State = "done"
		case at.Equal(l.Newest):
			t.State = "running"
		default:
			t.State = "open"
		}
		j.Ticks = append(j.Ticks, t)
	}
	if err := rows.Err(); err != nil {
		return db.explain(err)
	}
	sort.Slice(j.Ticks, func(a, b int) bool { return j.Ticks[a].Tick.After(j.Ticks[b].Tick) })
	if len(j.Ticks) > limit {
		j.Ticks = j.Ticks[:limit]
	}
	return nil
}

// tickRows are the table's rows: per job, ticks and runs of missed ticks,
// newest first.
func tickRows(jobs []jobJSON) [][]string {
	var out [][]string
	for _, j := range jobs {
		type row struct {
			at time.Time
			r  []string
		}
		var rs []row
		for _, t := range j.Ticks {
			cursor := t.Cursor
			if cursor == "" {
				cursor = "-"
			}
			rs = append(rs, row{t.Tick, []string{j.Job, tick.Key(t.Tick), t.State, fmt.Sprint(t.Token), cursor, timeOrDash(t.At)}})
		}
		for _, m := range j.Missed {
			span := tick.Key(m.First)
			if !m.Last.Equal(m.First) {
				span += " .. " + tick.Key(m.Last)
			}
			rs = append(rs, row{m.Last, []string{j.Job, span, fmt.Sprintf("missed (%d)", m.Count), "-", "-", "found at " + tick.Key(m.Found)}})
		}
		sort.SliceStable(rs, func(a, b int) bool { return rs[a].at.After(rs[b].at) })
		for _, r := range rs {
			out = append(out, r.r)
		}
	}
	return out
}
