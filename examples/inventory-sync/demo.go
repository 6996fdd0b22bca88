package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
)

// A scenario is one way the lock can fail a job that runs too long.
type scenario struct {
	name     string
	about    string
	watchdog bool
	proxyA   bool // A reaches Redis through the fault proxy
}

var scenarios = []scenario{
	{"overrun", "fixed lease, no watchdog; the job takes 1.5x the lease", false, false},
	{"watchdog", "same job, the watchdog renews the lease while A works", true, false},
	{"pause", "watchdog on; A is SIGSTOPped for 2x the lease mid-batch, then SIGCONTed", true, false},
	{"partition", "watchdog on; A's Redis connection is blackholed for 2x the lease, then restored", true, true},
	{"precommit", "watchdog on; A is SIGSTOPped just before a chunk's COMMIT goes out, after its last lease check, for 2x the lease", true, false},
}

// demoSettings scale the 30 s lease / 45 s job incident down to seconds.
type demoSettings struct {
	lease      time.Duration
	skus       int
	chunkSize  int
	chunkDelay time.Duration
	faultAfter int // chunks A commits before the fault
	// sched is the scheduled scenario's scale; nil: it does not run.
	sched    *schedSettings
	jsonOnly bool
	out      io.Writer
	exe      string // binary to run workers from
}

// Result is what one run did, counted from the database.
type Result struct {
	Name       string `json:"name"`
	Guard      bool   `json:"guard"`
	Rows       int64  `json:"rows"`
	Duplicates int64  `json:"duplicates"`
	// StaleRejected counts stale writes that did not commit: rejected by
	// Postgres (token older than one it has seen) plus refused by guard
	// because the lease was lost while the write was in flight.
	StaleRejected int64 `json:"stale_rejected"`
	// RejectedByDB is the part of StaleRejected that Postgres rejected.
	RejectedByDB int64 `json:"stale_rejected_by_db"`
	Overlap      bool  `json:"overlap"`
	// StaleCommits counts chunks committed by a holder after a newer holder
	// had acquired the lock.
	StaleCommits int64 `json:"stale_commits"`
	// Stopped counts workers that stopped on their own because their lock
	// context was cancelled (lock lost) before writing.
	Stopped  int64 `json:"stopped_lock_lost"`
	Expected int   `json:"expected_rows"`
	// EffectsSent counts the pushes the receiver got (one per committed
	// chunk is expected: EffectsExpected).
	EffectsSent     int64 `json:"effects_sent"`
	EffectsExpected int   `json:"effects_expected"`
	// EffectsDuplicate counts the chunks whose push the receiver applied
	// more than once.
	EffectsDuplicate int64 `json:"effects_duplicate"`
	// EffectsStale counts pushes from a transaction that did not commit,
	// or that committed after a newer holder had taken the lock.
	EffectsStale int64   `json:"effects_stale"`
	Seconds      float64 `json:"seconds"`
}

func demoMain(args []string) int {
	fs := flag.NewFlagSet("inventory-sync", flag.ContinueOnError)
	only := fs.String("scenario", "", "run one scenario: overrun, watchdog, pause, partition, precommit or scheduled")
	s := demoSettings{out: os.Stdout}
	fs.BoolVar(&s.jsonOnly, "json", false, "print only the JSON result")
	fs.DurationVar(&s.lease, "lease", 1500*time.Millisecond, "lock lease (the incident's 30 s, scaled down)")
	fs.IntVar(&s.skus, "skus", 300, "SKUs in the source snapshot")
	fs.IntVar(&s.chunkSize, "chunk-size", 20, "rows per chunk")
	fs.DurationVar(&s.chunkDelay, "chunk-delay", 0, "per-chunk delay (default: so the job takes 1.5x the lease)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if s.jsonOnly {
		s.out = io.Discard
	}
	chunks := (s.skus + s.chunkSize - 1) / s.chunkSize
	if s.chunkDelay == 0 {
		s.chunkDelay = s.lease * 3 / 2 / time.Duration(chunks)
	}
	s.faultAfter = max(1, chunks/4)
	var list []scenario
	for _, sc := range scenarios {
		if *only == "" || *only == sc.name {
			list = append(list, sc)
		}
	}
	if *only == "" || *only == "scheduled" {
		ss := defaultSched
		s.sched = &ss
	}
	if len(list) == 0 && s.sched == nil {
		fmt.Fprintf(os.Stderr, "inventory-sync: unknown scenario %q (overrun, watchdog, pause, partition, precommit, scheduled)\n", *only)
		return exitUsage
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "inventory-sync: %v\n", err)
		return exitError
	}
	s.exe = exe

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, sched, err := runDemo(ctx, s, list)
	if err != nil {
		fmt.Fprintf(os.Stderr, "inventory-sync: %v\n", err)
		if ctx.Err() != nil {
			return exitInterrupt
		}
		return exitError
	}
	if len(results) > 0 {
		printResults(s.out, results)
	}
	printScheduled(s.out, sched)
	b, _ := json.Marshal(map[string]any{"scenarios": results, "scheduled": sched})
	fmt.Println(string(b))
	return exitOK
}

// env is the servers the demo runs against.
type env struct {
	redisURL, redisAddr string
	dbURL               string
	pool                *pgxpool.Pool
	effectsURL          string // the receiver's
	cleanup             []func()
}

func (e *env) close() {
	for i := len(e.cleanup) - 1; i >= 0; i-- {
		e.cleanup[i]()
	}
}

func startEnv(ctx context.Context, out io.Writer) (*env, error) {
	e := &env{}
	if u := os.Getenv("REDIS_URL"); u != "" {
		e.redisURL = u
		e.redisAddr = strings.TrimPrefix(strings.SplitN(strings.TrimPrefix(u, "redis://"), "/", 2)[0], "")
		fmt.Fprintf(out, "Redis:    %s (REDIS_URL)\n", u)
	} else {
		r, err := testenv.StartRedis()
		if err != nil {
			return nil, err
		}
		e.cleanup = append(e.cleanup, func() { _ = r.Stop() })
		e.redisURL, e.redisAddr = r.URL, r.Addr
		fmt.Fprintf(out, "Redis:    throwaway redis-server on %s\n", r.Addr)
	}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		e.dbURL = u
		fmt.Fprintf(out, "Postgres: %s (DATABASE_URL)\n", u)
	} else {
		pg, err := testenv.StartPostgres()
		if err != nil {
			e.close()
			return nil, err
		}
		e.cleanup = append(e.cleanup, func() { _ = pg.Stop() })
		_, url, err := pg.CreateDatabase(ctx)
		if err != nil {
			e.close()
			return nil, err
		}
		e.dbURL = url
		fmt.Fprintf(out, "Postgres: throwaway server on %s\n", pg.Addr)
	}
	pool, err := pgxpool.New(ctx, e.dbURL)
	if err != nil {
		e.close()
		return nil, err
	}
	e.pool = pool
	e.cleanup = append(e.cleanup, pool.Close)
	db := stdlib.OpenDBFromPool(pool)
	err = migrations.Up(ctx, db)
	_ = db.Close()
	if err != nil {
		e.close()
		return nil, fmt.Errorf("apply fencelock migrations: %w", err)
	}
	if err := installSchema(ctx, pool); err != nil {
		e.close()
		return nil, err
	}
	rc, err := startReceiver(pool)
	if err != nil {
		e.close()
		return nil, err
	}
	e.cleanup = append(e.cleanup, rc.close)
	e.effectsURL = rc.url
	stopRelay, err := startRelay(pool)
	if err != nil {
		e.close()
		return nil, err
	}
	e.cleanup = append(e.cleanup, stopRelay)
	return e, nil
}

func runDemo(ctx context.Context, s demoSettings, list []scenario) ([]Result, []SchedResult, error) {
	e, err := startEnv(ctx, s.out)
	if err != nil {
		return nil, nil, err
	}
	defer e.close()
	stamp := time.Now().Format("150405")
	results := []Result{}
	for _, sc := range list {
		fmt.Fprintf(s.out, "\n== %s: %s\n", sc.name, sc.about)
		for _, guardOn := range []bool{false, true} {
			r, err := runScenario(ctx, s, e, sc, guardOn, stamp)
			if err != nil {
				return nil, nil, err
			}
			results = append(results, r)
		}
	}
	sched := []SchedResult{}
	if s.sched != nil {
		fmt.Fprintf(s.out, "\n== scheduled: %s\n", schedAbout(*s.sched))
		for _, guardOn := range []bool{false, true} {
			r, err := runScheduled(ctx, s, e, *s.sched, guardOn, stamp)
			if err != nil {
				return nil, nil, err
			}
			sched = append(sched, r)
		}
	}
	return results, sched, nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// scenarioRun is one run of a scenario: its name in sync_log, and the
// warehouse and snapshot its workers sync.
type scenarioRun struct {
	sc        scenario
	guardOn   bool
	name      string
	warehouse string
	snapshot  string
}

// runScenario runs workers A and B as processes, injects the scenario's
// fault into A, waits for both, and counts the outcome in the database.
func runScenario(ctx context.Context, s demoSettings, e *env, sc scenario, guardOn bool, stamp string) (Result, error) {
	r := scenarioRun{sc: sc, guardOn: guardOn, name: sc.name + "/guard-" + onOff(guardOn),
		warehouse: "wh-" + sc.name + "-" + onOff(guardOn) + "-" + stamp, snapshot: "snap-" + stamp}
	res := Result{Name: sc.name, Guard: guardOn, Expected: s.skus, EffectsExpected: (s.skus + s.chunkSize - 1) / s.chunkSize}
	if err := seedSnapshot(ctx, e.pool, r.warehouse, r.snapshot, s.skus); err != nil {
		return res, err
	}
	fmt.Fprintf(s.out, "-- guard %s\n", onOff(guardOn))
	start := time.Now()

	redisForA := e.redisURL
	var proxy *testenv.Proxy
	if sc.proxyA {
		p, err := testenv.NewProxy(e.redisAddr)
		if err != nil {
			return res, err
		}
		defer p.Close()
		proxy = p
		redisForA = "redis://" + p.Addr
	}
	ev := newEventLog(s.out, start)
	a, err := startWorker(ctx, s.exe, "A", r.args(s, e, "A", redisForA), ev)
	if err != nil {
		return res, err
	}
	defer a.kill()
	if err := ev.waitFor(ctx, "A", "acquired", -1, 10*time.Second); err != nil {
		return res, fmt.Errorf("%s: %w", r.name, err)
	}
	b, err := startWorker(ctx, s.exe, "B", r.args(s, e, "B", e.redisURL), ev)
	if err != nil {
		return res, err
	}
	defer b.kill()
	if err := r.injectFault(ctx, s, e, ev, a, proxy); err != nil {
		return res, err
	}
	for _, w := range []*workerProc{a, b} {
		if err := w.wait(ctx, 60*time.Second); err != nil {
			return res, fmt.Errorf("%s: worker %s: %w", r.name, w.name, err)
		}
	}
	if err := waitDelivered(ctx, e.pool, 30*time.Second); err != nil {
		return res, fmt.Errorf("%s: %w", r.name, err)
	}
	res.Seconds = time.Since(start).Seconds()
	return res, r.tally(ctx, s, e, &res)
}

// args are worker's command-line flags: A freezes in the scenarios that
// pause it.
func (r scenarioRun) args(s demoSettings, e *env, worker, redisURL string) []string {
	freeze, freezeCommit := -1, -1
	if r.sc.name == "pause" && worker == "A" {
		freeze = s.faultAfter
	}
	if r.sc.name == "precommit" && worker == "A" {
		freezeCommit = s.faultAfter
	}
	return []string{"-freeze-at-chunk", fmt.Sprint(freeze), "-freeze-before-commit-chunk", fmt.Sprint(freezeCommit),
		"-run", r.name, "-name", worker, "-warehouse", r.warehouse, "-snapshot", r.snapshot,
		"-lease", s.lease.String(), fmt.Sprintf("-watchdog=%v", r.sc.watchdog), fmt.Sprintf("-guard=%v", r.guardOn),
		"-chunk-size", fmt.Sprint(s.chunkSize), "-chunk-delay", s.chunkDelay.String(),
		"-redis", redisURL, "-db", e.dbURL, "-effects-url", e.effectsURL,
	}
}

// injectFault injects the scenario's fault into worker a, and logs it in
// sync_log: a SIGSTOP it asked for (pause, precommit), held for twice the
// lease, or a partition of its Redis connection (through proxy).
func (r scenarioRun) injectFault(ctx context.Context, s demoSettings, e *env, ev *eventLog, a *workerProc, proxy *testenv.Proxy) error {
	logFault := func(what string) {
		ev.note("demo", what)
		_, _ = e.pool.Exec(context.Background(), `INSERT INTO sync_log (run, worker, event, detail) VALUES ($1, 'demo', 'fault', $2)`, r.name, what)
	}
	hold := 2 * s.lease
	switch r.sc.name {
	case "pause", "precommit":
		// A freezes itself with SIGSTOP in the middle of a chunk's
		// transaction (pause) or just before its commit goes out
		// (precommit); the demo checks it is stopped and SIGCONTs it after
		// twice the lease.
		if err := ev.waitFor(ctx, "A", "frozen", -1, 20*time.Second); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		if err := waitStopped(ctx, a.cmd.Process.Pid, 5*time.Second); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		where := "mid-transaction"
		if r.sc.name == "precommit" {
			where = "just before its COMMIT"
		}
		logFault(fmt.Sprintf("A is SIGSTOPped %s for %v", where, hold))
		if err := sleepCtx(ctx, hold); err != nil {
			return err
		}
		logFault("SIGCONT A")
		_ = a.cmd.Process.Signal(syscall.SIGCONT)
	case "partition":
		if err := ev.waitFor(ctx, "A", "committed", s.faultAfter-1, 20*time.Second); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		logFault(fmt.Sprintf("blackhole A's Redis connection for %v", hold))
		proxy.Blackhole()
		if err := sleepCtx(ctx, hold); err != nil {
			return err
		}
		logFault("restore A's Redis connection")
		proxy.Restore()
	}
	return nil
}

// tally counts the run's outcome in the database into res and prints it
// with the run's timeline.
func (r scenarioRun) tally(ctx context.Context, s demoSettings, e *env, res *Result) error {
	if err := countResult(ctx, e.pool, r.name, r.warehouse, r.snapshot, res); err != nil {
		return err
	}
	if err := countEffects(ctx, e.pool, r.name, res); err != nil {
		return err
	}
	fmt.Fprintf(s.out, "   rows %d, duplicates %d, stale writes rejected %d (by Postgres %d), stale commits %d; pushes %d of %d chunks, %d applied twice, %d stale (%.1fs)\n",
		res.Rows, res.Duplicates, res.StaleRejected, res.RejectedByDB, res.StaleCommits,
		res.EffectsSent, res.EffectsExpected, res.EffectsDuplicate, res.EffectsStale, res.Seconds)
	return printTimeline(ctx, s.out, e.pool, r.name)
}

// countResult counts the outcome from the database itself.
func countResult(ctx context.Context, pool *pgxpool.Pool, runName, warehouse, snapshot string, r *Result) error {
	err := pool.QueryRow(ctx, `
		SELECT count(*), count(*) - count(DISTINCT sku)
		FROM stock_records WHERE warehouse = $1 AND snapshot_id = $2`, warehouse, snapshot).Scan(&r.Rows, &r.Duplicates)
	if err != nil {
		return fmt.Errorf("count rows: %w", err)
	}
	err = pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE event IN ('rejected_stale', 'rejected_lease_lost')),
		       count(*) FILTER (WHERE event = 'rejected_stale'),
		       count(*) FILTER (WHERE event = 'stopped_lock_lost')
		FROM sync_log WHERE run = $1`, runName).Scan(&r.StaleRejected, &r.RejectedByDB, &r.Stopped)
	if err != nil {
		return fmt.Errorf("count rejections: %w", err)
	}
	// A stale commit: a chunk committed by a holder after a holder with a
	// newer token had acquired the lock.
	err = pool.QueryRow(ctx, `
		SELECT count(*) FROM sync_log c
		WHERE c.run = $1 AND c.event = 'committed' AND EXISTS (
			SELECT 1 FROM sync_log a
			WHERE a.run = c.run AND a.event = 'acquired' AND a.token > c.token AND a.at < c.at)`, runName).Scan(&r.StaleCommits)
	if err != nil {
		return fmt.Errorf("count overlap: %w", err)
	}
	r.Overlap = r.StaleCommits > 0
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitStopped waits until process pid is in the stopped state.
func waitStopped(ctx context.Context, pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err == nil {
			if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && b[i+2] == 'T' {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("worker %d did not stop within %v", pid, limit)
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
}
