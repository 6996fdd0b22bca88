package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

func printResults(out io.Writer, results []Result) {
	fmt.Fprintln(out, "\n| scenario  | guard | rows | expected | duplicates | stale writes rejected | by Postgres | stopped on lock loss | stale commits | effects sent | effects duplicate | effects stale |")
	fmt.Fprintln(out, "|-----------|-------|------|----------|------------|-----------------------|-------------|----------------------|---------------|--------------|-------------------|---------------|")
	for _, r := range results {
		fmt.Fprintf(out, "| %-9s | %-5s | %4d | %8d | %10d | %21d | %11d | %20d | %13d | %12d | %17d | %13d |\n",
			r.Name, onOff(r.Guard), r.Rows, r.Expected, r.Duplicates, r.StaleRejected, r.RejectedByDB, r.Stopped, r.StaleCommits,
			r.EffectsSent, r.EffectsDuplicate, r.EffectsStale)
	}
	fmt.Fprintln(out, "\nCounted in the database: rows and duplicates from stock_records; the rest from sync_log, where")
	fmt.Fprintln(out, "each chunk's 'committed' row is written in the chunk's own transaction. A stale commit is a chunk")
	fmt.Fprintln(out, "committed by a holder after a newer holder had taken the lock (overlap = any stale commit).")
	fmt.Fprintln(out, "A stale write is rejected by Postgres (its token is older than one the database has seen) or,")
	fmt.Fprintln(out, "earlier, rolled back by guard because the lock was lost while the write was in flight;")
	fmt.Fprintln(out, "'stopped on lock loss' counts workers that stopped between writes when their lock context ended.")
	fmt.Fprintln(out, "Effects are the pushes of each committed chunk's stock levels to the receiver (one per chunk is")
	fmt.Fprintln(out, "expected): guard off posted right after the commit, guard on through the outbox. From")
	fmt.Fprintln(out, "effects_received: sent = pushes the receiver got, duplicate = chunks it applied more than once,")
	fmt.Fprintln(out, "stale = pushes from a transaction that did not commit or committed after a newer holder took over.")
}

// printTimeline shows, from sync_log, who held the lock when and which
// chunk writes committed or bounced. Runs of committed chunks are folded.
func printTimeline(ctx context.Context, out io.Writer, pool *pgxpool.Pool, runName string) error {
	rows, err := pool.Query(ctx, `SELECT at, worker, token, event, chunk, detail FROM sync_log WHERE run = $1 ORDER BY at, id`, runName)
	if err != nil {
		return fmt.Errorf("timeline: %w", err)
	}
	defer rows.Close()
	type ev struct {
		at                    time.Time
		worker, event, detail string
		token                 int64
		chunk                 int
	}
	var evs []ev
	for rows.Next() {
		var e ev
		if err := rows.Scan(&e.at, &e.worker, &e.token, &e.event, &e.chunk, &e.detail); err != nil {
			return err
		}
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(evs) == 0 {
		return nil
	}
	t0 := evs[0].at
	fmt.Fprintf(out, "   timeline of %s (from sync_log):\n", runName)
	col := func(worker string) string {
		switch worker {
		case "A":
			return ""
		case "B":
			return strings.Repeat(" ", 34)
		}
		return strings.Repeat(" ", 17)
	}
	for i := 0; i < len(evs); i++ {
		e := evs[i]
		text := ""
		switch e.event {
		case "committed":
			j := i
			for j+1 < len(evs) && evs[j+1].event == "committed" && evs[j+1].worker == e.worker {
				j++
			}
			if j > i {
				text = fmt.Sprintf("%s wrote chunks %d-%d", e.worker, e.chunk, evs[j].chunk)
			} else {
				text = fmt.Sprintf("%s wrote chunk %d", e.worker, e.chunk)
			}
			i = j
		case "acquired":
			text = fmt.Sprintf("%s holds lock (token ..%d)", e.worker, e.token%1000000)
		case "rejected_stale":
			text = fmt.Sprintf("%s chunk %d REJECTED by Postgres: stale token", e.worker, e.chunk)
		case "rejected_lease_lost":
			text = fmt.Sprintf("%s chunk %d ROLLED BACK: lock lost mid-write", e.worker, e.chunk)
		case "frozen":
			text = fmt.Sprintf("%s frozen while writing chunk %d", e.worker, e.chunk)
			if strings.Contains(e.detail, "COMMIT") {
				text = fmt.Sprintf("%s frozen just before committing chunk %d", e.worker, e.chunk)
			}
		case "stopped_lock_lost":
			text = fmt.Sprintf("%s stops: lock lost", e.worker)
		case "fault":
			text = "!! " + e.detail
		default:
			text = fmt.Sprintf("%s %s", e.worker, e.event)
			if e.chunk >= 0 {
				text += fmt.Sprintf(" at chunk %d", e.chunk)
			}
		}
		fmt.Fprintf(out, "   %6.2fs %s%s\n", e.at.Sub(t0).Seconds(), col(e.worker), text)
	}
	return nil
}
