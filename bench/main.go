// Command bench measures fencelock against the Go Redis lock libraries
// users compare it with (go-redsync/redsync v4 and bsm/redislock), in one
// process, against one Redis, with the libraries interleaved within every
// repetition. It prints a markdown table, writes a JSON document, and prints
// one JSON object (the summary) as its last line.
//
//	cd bench && go run . -out results/latest.json
//
// It lives in its own module so the peers never enter the library's go.mod.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// config sizes a run. The defaults keep `make bench` under 10 minutes on 2
// cores; quick() is the smoke test's.
type config struct {
	Reps             int           `json:"reps"`
	RTTOps           int           `json:"rtt_ops"`
	UncontendedOps   int           `json:"uncontended_ops"`
	ParallelWorkers  int           `json:"parallel_workers"`
	ParallelDur      time.Duration `json:"parallel_duration_ns"`
	HandoffRounds    int           `json:"handoff_rounds"`
	HandoffHold      time.Duration `json:"handoff_hold_ns"`
	ContendedWorkers int           `json:"contended_workers"`
	ContendedHold    time.Duration `json:"contended_hold_ns"`
	ContendedDur     time.Duration `json:"contended_duration_ns"`
	RenewalLocks     []int         `json:"renewal_locks"`
	RenewalLease     time.Duration `json:"renewal_lease_ns"`
	RenewalPeriods   int           `json:"renewal_periods"`
	RenewalReps      int           `json:"renewal_reps"`
	// RenewalDefaultLocks locks are measured once more at
	// RenewalDefaultLease (fence.DefaultLease in a real run): the cost an
	// application that sets no lease pays.
	RenewalDefaultLocks int           `json:"renewal_default_locks"`
	RenewalDefaultLease time.Duration `json:"renewal_default_lease_ns"`
	GuardTxDirect       int           `json:"guard_tx_direct"`
	GuardTxProxied      int           `json:"guard_tx_proxied"`
	ProxyDelay          time.Duration `json:"proxy_delay_ns"`
	SyncRows            int           `json:"sync_rows"`
	OutboxLatencyN      int           `json:"outbox_latency_n"`
	OutboxPollN         int           `json:"outbox_poll_n"`
	OutboxBacklog       int           `json:"outbox_backlog"`
	FairClients         int           `json:"fair_clients"`
	FairGoroutines      int           `json:"fair_goroutines"`
	FairHold            time.Duration `json:"fair_hold_ns"`
	QueueWaiters        int           `json:"queue_waiters"`
	QueueLiveness       time.Duration `json:"queue_liveness_ns"`
	QueueReleases       int           `json:"queue_releases"`
	HeadLiveness        time.Duration `json:"head_liveness_ns"`
	LeaderKillLease     time.Duration `json:"leader_kill_lease_ns"`
	Observers           int           `json:"observers"`
	ObserverProcs       int           `json:"observer_procs"`
	ObserveRounds       int           `json:"observe_rounds"`
	// Etcd adds etcd's concurrency.Mutex to handoff2 and fair, and its
	// Election to election, on an etcd server the bench starts (Debian
	// package etcd-server).
	Etcd bool     `json:"etcd"`
	Only []string `json:"only,omitempty"`
}

func defaultConfig() config {
	return config{
		Reps: 5, RTTOps: 2000, UncontendedOps: 1000,
		ParallelWorkers: 16, ParallelDur: time.Second,
		HandoffRounds: 30, HandoffHold: 10 * time.Millisecond,
		ContendedWorkers: 16, ContendedHold: time.Millisecond, ContendedDur: 5 * time.Second,
		RenewalLocks: []int{1000, 10000}, RenewalLease: 3 * time.Second, RenewalPeriods: 3, RenewalReps: 5,
		RenewalDefaultLocks: 1000, RenewalDefaultLease: fence.DefaultLease,
		GuardTxDirect: 400, GuardTxProxied: 60, ProxyDelay: time.Millisecond,
		SyncRows:       10000,
		OutboxLatencyN: 200, OutboxPollN: 30, OutboxBacklog: 20000,
		FairClients: 4, FairGoroutines: 4, FairHold: time.Millisecond,
		QueueWaiters: 10000, QueueLiveness: fence.DefaultLiveness, QueueReleases: 32, HeadLiveness: 3 * time.Second,
		LeaderKillLease: 3 * time.Second, Observers: 1000, ObserverProcs: 4, ObserveRounds: 10,
		Etcd: true,
	}
}

func quickConfig() config {
	return config{
		Reps: 1, RTTOps: 50, UncontendedOps: 30,
		ParallelWorkers: 4, ParallelDur: 100 * time.Millisecond,
		HandoffRounds: 2, HandoffHold: 5 * time.Millisecond,
		ContendedWorkers: 4, ContendedHold: time.Millisecond, ContendedDur: 300 * time.Millisecond,
		RenewalLocks: []int{50}, RenewalLease: 900 * time.Millisecond, RenewalPeriods: 1, RenewalReps: 1,
		RenewalDefaultLocks: 50, RenewalDefaultLease: 900 * time.Millisecond,
		GuardTxDirect: 10, GuardTxProxied: 3, ProxyDelay: time.Millisecond,
		SyncRows:       50,
		OutboxLatencyN: 5, OutboxPollN: 2, OutboxBacklog: 200,
		FairClients: 2, FairGoroutines: 2, FairHold: time.Millisecond,
		QueueWaiters: 200, QueueLiveness: 600 * time.Millisecond, QueueReleases: 4, HeadLiveness: 500 * time.Millisecond,
		LeaderKillLease: 500 * time.Millisecond, Observers: 20, ObserverProcs: 2, ObserveRounds: 2,
		// The toy run (make test) needs no etcd server.
		Etcd: false,
	}
}

func (c config) wants(s string) bool {
	if len(c.Only) == 0 {
		return true
	}
	for _, o := range c.Only {
		if o == s {
			return true
		}
	}
	return false
}

func main() {
	childMain() // a process of a cross-process scenario: plays its role and exits
	out := flag.String("out", "results/latest.json", "where to write the JSON results (empty: do not write)")
	quick := flag.Bool("quick", false, "tiny run (harness smoke test); figures mean nothing")
	pin := flag.Bool("pin", true, "pin servers to CPU 0 and the client to CPU 1 with GOMAXPROCS=1")
	only := flag.String("only", "", "comma-separated scenarios to run (default: all)")
	reps := flag.Int("reps", 0, "repetitions (default 5)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run")
	charts := flag.String("charts", "", "only derive from this results file what a run derives (its charts next to it; for results/latest.json also the README's results part), and exit")
	etcd := flag.Bool("etcd", true, "etcd's concurrency.Mutex as a peer in handoff2 and fair, and its Election in election (needs the Debian package etcd-server; off with -quick unless given)")
	flag.Parse()

	if *charts != "" {
		if err := deriveFrom(*charts, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}

	cfg := defaultConfig()
	if *quick {
		cfg = quickConfig()
	}
	if *reps > 0 {
		cfg.Reps = *reps
	}
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "etcd" {
			cfg.Etcd = *etcd
		}
	})
	if !*quick {
		cfg.Etcd = *etcd
	}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	res, err := run(context.Background(), cfg, *pin, *cpuprofile, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if *out != "" {
		if err := writeJSON(*out, res); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		// The same table as stdout, next to the JSON, for bench/README.md to
		// link to.
		var md strings.Builder
		printMarkdown(&md, res)
		if err := os.WriteFile(strings.TrimSuffix(*out, ".json")+".md", []byte(md.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		// The headline charts, from the same results, next to them.
		if err := drawCharts(res, filepath.Dir(*out)); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		// The README's results part, when this is the committed file.
		if err := writeReadme(*out, res); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
	printMarkdown(os.Stdout, res)
	line, _ := json.Marshal(res.summary(*out))
	fmt.Println(string(line))
}

func writeJSON(path string, res *results) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// env is what the scenarios share: the servers and the libraries.
type env struct {
	cfg   config
	log   io.Writer
	redis *testenv.Redis
	pg    *testenv.Postgres
	libs  []locker // fence first, then the peers
	// fastPoll is redislock polling every millisecond: informational.
	fastPoll *redislockLocker
	fence    *fenceLocker
	ping     *redis.Client // PING and INFO, outside every library's client
	// etcd, when the run has the etcd peer; etcdc probes it.
	etcd  *etcdServer
	etcdc *clientv3.Client
}

func logf(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
}

func run(ctx context.Context, cfg config, pin bool, cpuprofile string, log io.Writer) (*results, error) {
	start := time.Now()
	res := newResults(cfg)
	pl := &res.Placement
	pl.NumCPU = runtime.NumCPU()
	pl.LoadAvgStart = loadAvg()
	pl.CPUModel = cpuModel()
	pl.GoVersion = runtime.Version()
	pinned := pin && pl.NumCPU >= 2
	if pinned {
		if err := pinClient(1); err != nil {
			return nil, fmt.Errorf("pin client: %w", err)
		}
	} else if pin {
		pl.Notes = append(pl.Notes, "fewer than 2 CPUs: not pinned")
	}
	pl.Pinned = pinned
	pl.ClientCPUs = affinityOf(os.Getpid())
	pl.GOMAXPROCS = runtime.GOMAXPROCS(0)

	stopProfile, err := startCPUProfile(cpuprofile)
	if err != nil {
		return nil, err
	}
	defer stopProfile()

	e := &env{cfg: cfg, log: log}
	defer e.close()
	if err := e.startServers(ctx, pinned, pl); err != nil {
		return nil, err
	}
	if err := e.startLibs(); err != nil {
		return nil, err
	}
	res.Settings = librarySettings()

	type scenario struct {
		name string
		fn   func(context.Context, *env, *results) error
	}
	for _, s := range []scenario{
		{"rtt", runRTT},
		{"uncontended", runUncontended},
		{"parallel", runParallel},
		{"shapes", runShapes},
		{"handoff", runHandoff},
		{"handoff2", runHandoff2},
		{"fair", runFair},
		{"queue", runQueue10k},
		{"headkill", runHeadKill},
		{"election", runElection},
		{"leaderkill", runLeaderKill},
		{"observe", runObserve},
		{"contended", runContended},
		{"renewal", runRenewal},
		{"guard", runGuard},
		{"sqlfence", runSQLFence},
		{"sync", runSync},
		{"tick", runTick},
		{"outbox", runOutbox},
		{"cluster", runCluster},
	} {
		if !cfg.wants(s.name) {
			continue
		}
		t0 := time.Now()
		logf(log, "scenario %s ...", s.name)
		if err := s.fn(ctx, e, res); err != nil {
			// A failed scenario is reported, not hidden; the others still run.
			logf(log, "scenario %s failed: %v", s.name, err)
			res.scenario(s.name).Error = err.Error()
		}
		res.scenario(s.name).Seconds = time.Since(t0).Seconds()
		logf(log, "scenario %s done in %.1fs", s.name, time.Since(t0).Seconds())
	}
	pl.LoadAvgEnd = loadAvg()
	res.Seconds = time.Since(start).Seconds()
	evaluateGoals(res)
	return res, nil
}
