package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/tick"
)

// schedSettings scale the scheduled scenario: three instances of the worker
// on one schedule.
type schedSettings struct {
	period time.Duration
	ticks  int
	lease  time.Duration
	chunks int
}

var defaultSched = schedSettings{period: time.Second, ticks: 10, lease: time.Second, chunks: 4}

// schedInstance is one instance of the scheduled scenario.
type schedInstance struct {
	name     string
	offset   time.Duration
	freezeAt int // it is SIGSTOPped mid-run in the first tick from this one on that it runs
	dieAt    int // it is SIGKILLed mid-run in the first tick from this one on that it runs
}

// The clock most ahead fires first and runs the ticks (the fair queue
// serves callers in arrival order): S2 until it dies, then S3.
var schedInstances = []schedInstance{
	{name: "S1"},
	{name: "S2", offset: 300 * time.Millisecond, dieAt: 3},
	{name: "S3", offset: 150 * time.Millisecond, freezeAt: 2},
}

// SchedResult is what one run of the scheduled scenario did, per tick,
// counted from tick_chunks: a committed run is a tick's last chunk
// committed; a duplicate, a chunk committed twice; a missed tick, one
// with no committed run.
type SchedResult struct {
	Guard           bool `json:"guard"`
	Ticks           int  `json:"ticks"`
	Once            int  `json:"run_once"`
	Duplicated      int  `json:"duplicated"`
	Missed          int  `json:"missed"`
	DuplicateChunks int  `json:"duplicate_chunks"`
	Resumed         int  `json:"resumed"`
	// Faults is how many of the two mid-run faults (a SIGKILL, a
	// SIGSTOP) were injected: each needs its instance to start a tick.
	Faults  int        `json:"faults"`
	PerTick []TickRuns `json:"per_tick"`
	Seconds float64    `json:"seconds"`
}

// TickRuns is one tick's count.
type TickRuns struct {
	Tick       string `json:"tick"`
	Runs       int    `json:"committed_runs"`
	Duplicates int    `json:"duplicate_chunks"`
	Holders    int    `json:"holders"`
}

func schedAbout(ss schedSettings) string {
	return fmt.Sprintf("three instances of the worker, one schedule (a tick every %v, %d ticks); S2's clock is %v ahead, S3's %v; S2 is SIGKILLed mid-run, S3 SIGSTOPped mid-run for 2x the lease",
		ss.period, ss.ticks, schedInstances[1].offset, schedInstances[2].offset)
}

// runScheduled runs the instances with guard off (the lock alone, as
// distributed lockers do) or on (tick.Runner), injects the faults, and
// counts each tick's committed runs in the database.
func runScheduled(ctx context.Context, s demoSettings, e *env, ss schedSettings, guardOn bool, stamp string) (SchedResult, error) {
	res := SchedResult{Guard: guardOn, Ticks: ss.ticks}
	job := "stock-sync:scheduled-" + onOff(guardOn) + "-" + stamp
	fmt.Fprintf(s.out, "-- guard %s\n", onOff(guardOn))
	start := time.Now()
	// Start on a tick far enough ahead for every instance to be up.
	from := tick.Every(ss.period).Next(time.Now().Add(2 * time.Second))
	ev := newEventLog(s.out, start)
	ev.quiet = map[string]bool{"already done": true, "ready": true, "held elsewhere": true, "superseded": true}
	var procs []*workerProc
	defer func() {
		for _, p := range procs {
			p.kill()
		}
	}()
	for _, in := range schedInstances {
		args := []string{"-name", in.name, "-job", job, "-period", ss.period.String(), "-offset", in.offset.String(),
			"-lease", ss.lease.String(), "-from", from.Format(time.RFC3339Nano), "-ticks", fmt.Sprint(ss.ticks),
			"-chunks", fmt.Sprint(ss.chunks), fmt.Sprintf("-guard=%v", guardOn), "-freeze-from-tick", fmt.Sprint(in.freezeAt),
			"-die-from-tick", fmt.Sprint(in.dieAt), "-redis", e.redisURL, "-db", e.dbURL}
		p, err := startProc(ctx, s.exe, in.name, args, schedulerEnv, ev)
		if err != nil {
			return res, err
		}
		procs = append(procs, p)
	}
	faults, err := schedFaults(ctx, ev, procs, ss, from)
	if err != nil {
		return res, err
	}
	res.Faults = faults
	for _, p := range procs {
		if err := p.waitExit(ctx, time.Minute); err != nil {
			return res, fmt.Errorf("scheduled/guard-%s: instance %s: %w", onOff(guardOn), p.name, err)
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if err := countTicks(ctx, e.pool, job, from, ss, &res); err != nil {
		return res, err
	}
	fmt.Fprintf(s.out, "   ticks %d: run once %d, duplicated %d, missed %d; duplicate chunks %d; resumed by another instance %d (%.1fs)\n",
		res.Ticks, res.Once, res.Duplicated, res.Missed, res.DuplicateChunks, res.Resumed, res.Seconds)
	return res, nil
}

// schedFaults SIGCONTs the instance that stopped itself, after twice the
// lease, and notes the one that killed itself; it returns how many of
// the two faults happened. Each instance faults in the first tick from
// its number on that it runs from the start; on a loaded machine the
// others may win every such tick, so a fault that has not come when the
// ticks are over is noted as not injected, not waited for.
func schedFaults(ctx context.Context, ev *eventLog, procs []*workerProc, ss schedSettings, from time.Time) (int, error) {
	over := from.Add(time.Duration(ss.ticks+1)*ss.period + 10*time.Second)
	faults := 0
	for i, in := range schedInstances {
		event := ""
		switch {
		case in.freezeAt > 0:
			event = "frozen"
		case in.dieAt > 0:
			event = "dying"
		default:
			continue
		}
		ok, err := ev.waitUntil(ctx, in.name, event, over)
		if err != nil {
			return faults, err
		}
		if !ok {
			ev.note("demo", fmt.Sprintf("%s ran no tick from its start after tick %d: no %s fault this run", in.name, max(in.freezeAt, in.dieAt), event))
			continue
		}
		faults++
		if event == "dying" {
			<-procs[i].done
			ev.note("demo", in.name+" was SIGKILLed mid-run")
			continue
		}
		if err := waitStopped(ctx, procs[i].cmd.Process.Pid, 5*time.Second); err != nil {
			return faults, err
		}
		ev.note("demo", fmt.Sprintf("%s is SIGSTOPped mid-run for %v", in.name, 2*ss.lease))
		if err := sleepCtx(ctx, 2*ss.lease); err != nil {
			return faults, err
		}
		ev.note("demo", "SIGCONT "+in.name)
		_ = procs[i].cmd.Process.Signal(syscall.SIGCONT)
	}
	// One that stopped itself after the wait above is not left stopped.
	for i, in := range schedInstances {
		if in.freezeAt > 0 {
			_ = procs[i].cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	return faults, nil
}

// countTicks counts each tick's committed runs from tick_chunks.
func countTicks(ctx context.Context, pool *pgxpool.Pool, job string, from time.Time, ss schedSettings, res *SchedResult) error {
	rows, err := pool.Query(ctx, `
SELECT t.tick, count(c.id) FILTER (WHERE c.chunk = c.chunks - 1), count(c.id) - count(DISTINCT c.chunk), count(DISTINCT c.token)
FROM generate_series($2::timestamptz, $2::timestamptz + ($3::int - 1) * $4 * interval '1 microsecond', $4 * interval '1 microsecond') AS t(tick)
LEFT JOIN tick_chunks c ON c.job = $1 AND c.tick = t.tick
GROUP BY t.tick ORDER BY t.tick`, job, from, ss.ticks, ss.period.Microseconds())
	if err != nil {
		return fmt.Errorf("count ticks: %w", err)
	}
	per, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TickRuns, error) {
		var t TickRuns
		var at time.Time
		err := r.Scan(&at, &t.Runs, &t.Duplicates, &t.Holders)
		t.Tick = tick.Key(at)
		return t, err
	})
	if err != nil {
		return fmt.Errorf("count ticks: %w", err)
	}
	res.PerTick = per
	for _, t := range per {
		res.DuplicateChunks += t.Duplicates
		if t.Holders > 1 && t.Runs == 1 && t.Duplicates == 0 {
			res.Resumed++
		}
		switch {
		case t.Runs == 1 && t.Duplicates == 0:
			res.Once++
		case t.Runs == 0:
			res.Missed++
		default:
			res.Duplicated++
		}
	}
	return nil
}

// printScheduled prints the scheduled scenario's table: per tick, the
// committed runs with guard off and on.
func printScheduled(out io.Writer, results []SchedResult) {
	if len(results) == 0 {
		return
	}
	fmt.Fprintln(out, "\n| scheduled | guard | ticks | run once | duplicated | missed | duplicate chunks | resumed by another instance |")
	fmt.Fprintln(out, "|-----------|-------|-------|----------|------------|--------|------------------|-----------------------------|")
	for _, r := range results {
		fmt.Fprintf(out, "| %-9s | %-5s | %5d | %8d | %10d | %6d | %16d | %27d |\n", "scheduled", onOff(r.Guard),
			r.Ticks, r.Once, r.Duplicated, r.Missed, r.DuplicateChunks, r.Resumed)
	}
	fmt.Fprintln(out, "\nCommitted runs per tick (must be 1):")
	head, line := "| guard |", "|-------|"
	for i := range results[0].PerTick {
		head += fmt.Sprintf(" #%-2d |", i+1)
		line += "-----|"
	}
	fmt.Fprintln(out, head)
	fmt.Fprintln(out, line)
	for _, r := range results {
		var b strings.Builder
		fmt.Fprintf(&b, "| %-5s |", onOff(r.Guard))
		for _, t := range r.PerTick {
			fmt.Fprintf(&b, " %3d |", t.Runs)
		}
		fmt.Fprintln(out, b.String())
	}
	fmt.Fprintln(out, "\nCounted in the database (tick_chunks: one row per chunk a tick's sync committed). A committed run")
	fmt.Fprintln(out, "is a tick whose last chunk committed; duplicated, a tick with more than one run or a chunk")
	fmt.Fprintln(out, "committed twice; missed, a tick with none. Guard off, each instance takes the job's lock when its")
	fmt.Fprintln(out, "clock says the tick is due, as distributed lockers do: the instances whose clocks are behind find")
	fmt.Fprintln(out, "it free once the first is done and run the tick again, and a tick whose runner died is left")
	fmt.Fprintln(out, "half-done. Guard on, tick.Runner runs each tick once and resumes an interrupted one at its cursor.")
}

// waitExit waits for a scheduler instance to exit: on its own, or killed
// by its fault.
func (w *workerProc) waitExit(ctx context.Context, limit time.Duration) error {
	select {
	case <-w.done:
	case <-ctx.Done():
		w.kill()
		return ctx.Err()
	case <-time.After(limit):
		w.kill()
		return fmt.Errorf("did not finish within %v", limit)
	}
	var ee *exec.ExitError
	if errors.As(w.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return nil
		}
	}
	return w.err
}
