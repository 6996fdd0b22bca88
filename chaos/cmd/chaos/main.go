// Command chaos runs the fault-injection suite of fencelock: worker
// processes doing fenced read-modify-write and append work while a nemesis
// injects faults, then a history checker (direct checks and a
// linearizability check) on every trial. See package chaos.
//
//	cd chaos && go run -race ./cmd/chaos -trials 200 -seed 42
//
// After the one-Redis run it runs the same suite on a Redis Cluster (3
// masters with a replica each): a guard-off control of lossy failovers,
// then -cluster-trials trials (default trials/5) of the cluster faults. The
// last line of stdout is a JSON object with both runs' summaries; with -out
// it is also written to that file, and a chart of loss detection and
// takeover per fault kind drawn from it next to it. Then the outbox's relay
// trials, and the scheduler trials (package tick: scheduler processes with
// offset clocks, stopped and killed mid-run), each with its control.
//
// It exits 1 when guard-on trials found violations, when a guard-off
// control found none (the checker would be proving nothing), or when
// trials could not run.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/fencelock/fencelock/chaos"
	"github.com/fencelock/fencelock/outbox/outboxtest"
	"github.com/fencelock/fencelock/tick/ticktest"
)

func main() {
	if chaos.IsWorker() {
		// Re-executed by the suite as one of its workers.
		os.Exit(chaos.WorkerMain())
	}
	if outboxtest.IsRelayProcess() {
		// Re-executed by the relay trials as one of their relays.
		os.Exit(outboxtest.RelayMain())
	}
	if ticktest.IsInstance() {
		// Re-executed by the scheduler trials as one of their instances.
		os.Exit(ticktest.InstanceMain())
	}
	var (
		trials    = flag.Int("trials", 200, "randomized trials with guard on (one fault each) on one Redis (0: only the cluster run)")
		seed      = flag.Int64("seed", 0, "seed of the fault schedule and the workers' choices (0: from the clock; printed)")
		kinds     = flag.String("kinds", "", "comma-separated fault kinds (default all: "+strings.Join(chaos.FaultKinds, ",")+")")
		control   = flag.Int("control", 9, "trials of the guard-off control run after the main run (0: none)")
		guardOn   = flag.Bool("guard", true, "fence the workers' writes with guard (false: the main run is a control run)")
		lease     = flag.Duration("lease", 400*time.Millisecond, "lock lease")
		bare      = flag.Bool("bare-lease", true, "odd-numbered workers give guard.Exec a bare lease (no Done channel): the database alone must reject their stale writes")
		idle      = flag.Duration("idle-timeout", 0, "pgstore.WithIdleTimeout for the workers' stores (0: off, the library default)")
		workers   = flag.Int("workers", 3, "worker processes per trial")
		contend   = flag.Int("contenders", 2, "worker processes added per trial that wait with short random limits, leaving the locks' queues while handovers race them (0: none)")
		resources = flag.Int("resources", 2, "resources per trial")
		verbose   = flag.Bool("v", false, "one line per trial")

		clusterTrials  = flag.Int("cluster-trials", -1, "trials on a Redis Cluster (3 masters + 3 replicas) after the one-Redis run (-1: trials/5, at least one per cluster fault kind; 0: none)")
		clusterControl = flag.Int("cluster-control", 6, "at most this many guard-off lossy-failover trials on the cluster, stopping at the first violation (0: none)")
		clusterLease   = flag.Duration("cluster-lease", time.Second, "lock lease of the cluster trials")
		controlLease   = flag.Duration("cluster-control-lease", 6*time.Second, "lock lease of the cluster control (long: the old holder keeps writing while the lock is taken on the promoted replica)")
		clusterKinds   = flag.String("cluster-kinds", "", "comma-separated cluster fault kinds (default all: "+strings.Join(chaos.ClusterFaultKinds, ",")+")")
		partial        = flag.Bool("partial-coverage", false, "cluster-require-full-coverage no (healthy masters keep answering while a dead master's slots are uncovered)")
		outboxTrials   = flag.Int("outbox-trials", 20, "outbox relay trials after the lock runs: a writer records effects while two relay processes deliver them, one SIGKILLed at random points (0: none)")
		outboxKills    = flag.Int("outbox-kills", 5, "relay kills per outbox trial")
		schedTrials    = flag.Int("scheduler-trials", 200, "scheduler trials after the outbox's: four scheduler processes, clocks offset, stopped and killed mid-run, each tick counted in the database (0: none)")
		schedTicks     = flag.Int("scheduler-ticks", 12, "ticks per scheduler trial")
		schedPeriod    = flag.Duration("scheduler-period", 300*time.Millisecond, "the scheduler trials' period (their lease 300 ms, each step period/6)")
		schedFirst     = flag.Int("scheduler-first", 0, "the number of the first scheduler trial (rerun trial n alone: -scheduler-trials 1 -scheduler-first n, same -seed)")
		schedOffset    = flag.Duration("scheduler-offset", 0, "the largest clock offset of a scheduler instance, either way (0: period/5, a 1 s offset on a 5 s period)")
		out            = flag.String("out", "", "write the runs' summaries to this JSON file (make chaos: results/latest.json) and the loss-detection and takeover chart next to it ("+chartFile+")")
	)
	flag.Parse()
	if *seed == 0 {
		*seed = time.Now().UnixNano() % 1_000_000_007
	}
	var ks []string
	if *kinds != "" {
		ks = strings.Split(*kinds, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	contenders := *contend
	if contenders == 0 {
		contenders = -1 // Config's zero is the default
	}
	cfg := chaos.Config{Trials: *trials, Seed: *seed, Guard: *guardOn, Kinds: ks, Workers: *workers, Contenders: contenders,
		Resources: *resources, Lease: *lease, IdleTimeout: *idle, BareLeases: *bare, WorkerCommand: chaos.SelfCommand, Verbose: *verbose}
	fmt.Printf("chaos: seed %d (rerun with -seed %d)\n", *seed, *seed)
	failed := false
	summary := map[string]chaos.Summary{}
	if *trials > 0 && *control > 0 {
		// The control first: if the checker cannot see the violations of
		// unfenced writes, the main run's zero means nothing.
		// SIGSTOP beyond the lease is the fault that lets a stale holder
		// write in most trials; a mix of every kind can, by chance, produce
		// no stale write at all and fail the control for nothing.
		c := cfg
		c.Trials, c.Guard, c.Kinds = *control, false, []string{chaos.FaultSigstop}
		fmt.Printf("chaos: control run, guard off, %d sigstop trials\n", c.Trials)
		rep, err := chaos.Run(ctx, c)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: control run: %v\n", err)
			os.Exit(1)
		}
		if rep.Violations == 0 {
			fmt.Printf("chaos: FAIL: the guard-off control found no violation: the checker proves nothing\n")
			failed = true
		} else {
			fmt.Printf("chaos: control ok: guard off produced %d violations, as it must\n\n", rep.Violations)
		}
	}
	if *trials > 0 {
		rep, err := chaos.Run(ctx, cfg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
			os.Exit(1)
		}
		failed = verdict(cfg, rep, *seed) || failed
		summary["one_redis"] = rep.Summary()
	}

	if *clusterTrials < 0 {
		*clusterTrials = max(*trials/5, len(chaos.ClusterFaultKinds))
	}
	if *clusterTrials > 0 {
		cc := cfg
		cc.Cluster, cc.PartialCoverage, cc.Lease, cc.Kinds = true, *partial, *clusterLease, nil
		if *clusterKinds != "" {
			cc.Kinds = strings.Split(*clusterKinds, ",")
		}
		if *clusterControl > 0 {
			// A failover to a replica that missed the last lock lets two
			// holders work at once; unfenced, their writes must show.
			c := cc
			c.Trials, c.Guard, c.Kinds, c.StopAtViolation = *clusterControl, false, []string{chaos.FaultClusterLossy}, true
			c.Lease = *controlLease
			fmt.Printf("\nchaos: cluster control run, guard off, up to %d lossy-failover trials\n", c.Trials)
			crep, err := chaos.Run(ctx, c)
			if err != nil {
				fmt.Fprintf(os.Stderr, "chaos: cluster control run: %v\n", err)
				os.Exit(1)
			}
			if crep.Violations == 0 {
				fmt.Printf("chaos: FAIL: the guard-off cluster control found no violation: the checker proves nothing\n")
				failed = true
			} else {
				fmt.Printf("chaos: cluster control ok: guard off produced %d violations, as it must\n\n", crep.Violations)
			}
		}
		cc.Trials = *clusterTrials
		fmt.Printf("chaos: cluster run, %d trials\n", cc.Trials)
		crep, err := chaos.Run(ctx, cc)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: cluster run: %v\n", err)
			os.Exit(1)
		}
		failed = verdict(cc, crep, *seed) || failed
		summary["cluster"] = crep.Summary()
	}
	last := map[string]any{}
	for k, v := range summary {
		last[k] = v
	}
	if *outboxTrials > 0 {
		fmt.Printf("\nchaos: outbox relay trials, %d trials, %d relay kills each\n", *outboxTrials, *outboxKills)
		orep, err := chaos.RunOutbox(ctx, chaos.OutboxConfig{Trials: *outboxTrials, Kills: *outboxKills, Seed: *seed,
			RelayCommand: chaos.SelfCommand, Out: os.Stdout, Verbose: *verbose})
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: outbox trials: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("chaos: outbox: %d kills, %d effects: %d lost, %d applied twice at the fenced receiver, %d duplicates at the unfenced one (at most %d: the relays' concurrency per kill), %d sent again early; redelivered %d-%d ms after the first send (visibility %d ms, poll %d ms)\n",
			orep.Kills, orep.Effects, orep.Lost, orep.AppliedTwice, orep.Duplicates, orep.DuplicatesAllowed, orep.EarlyRedeliveries,
			orep.RedeliveryMinMS, orep.RedeliveryMaxMS, orep.VisibilityMS, orep.PollMS)
		if orep.Failed() {
			fmt.Printf("chaos: FAIL: the outbox broke its promise (seed %d)\n", *seed)
			failed = true
		}
		if orep.Trials >= 10 && orep.Duplicates == 0 {
			fmt.Printf("chaos: FAIL: no kill landed between a send and its record: the relay trials prove nothing\n")
			failed = true
		}
		last["outbox"] = orep
	}
	if *schedTrials > 0 {
		srep, bad := schedulerRun(ctx, chaos.SchedulerConfig{Trials: *schedTrials, Ticks: *schedTicks, Period: *schedPeriod,
			MaxOffset: *schedOffset, FirstTrial: *schedFirst, Seed: *seed, Command: chaos.SelfCommand, Out: os.Stdout, Verbose: *verbose})
		failed = failed || bad
		if srep != nil {
			last["scheduler"] = srep
		}
	}
	if *out != "" {
		if err := writeResults(*out, summary); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
			failed = true
		}
		for _, kind := range []string{"outbox", "scheduler"} {
			if o, ok := last[kind]; ok {
				b, _ := json.MarshalIndent(o, "", "  ")
				if err := os.WriteFile(filepath.Join(filepath.Dir(*out), kind+".json"), append(b, '\n'), 0o644); err != nil {
					fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
					failed = true
				}
			}
		}
	}
	// The last line of stdout: every run's figures.
	b, _ := json.Marshal(last)
	fmt.Println(string(b))
	if failed {
		os.Exit(1)
	}
}

// schedulerRun runs the scheduler kind: a guard-off control (the lock
// alone, whose late instances must run ticks twice), then the trials.
func schedulerRun(ctx context.Context, cfg chaos.SchedulerConfig) (*chaos.SchedulerReport, bool) {
	fmt.Printf("\nchaos: scheduler control run, guard off (the lock alone), 3 trials\n")
	ctl := cfg
	ctl.Trials, ctl.Guard, ctl.StepDelay = 3, false, time.Millisecond
	crep, err := chaos.RunScheduler(ctx, ctl)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: scheduler control: %v\n", err)
		return nil, true
	}
	failed := false
	if crep.Duplicated == 0 {
		fmt.Printf("chaos: FAIL: the guard-off scheduler control ran no tick twice: the checker proves nothing\n")
		failed = true
	} else {
		fmt.Printf("chaos: scheduler control ok: the lock alone ran %d of %d ticks more than once\n", crep.Duplicated, crep.Ticks)
	}
	fmt.Printf("chaos: scheduler trials, %d trials of %d ticks every %v\n", cfg.Trials, cfg.Ticks, cfg.Period)
	cfg.Guard = true
	rep, err := chaos.RunScheduler(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: scheduler trials: %v\n", err)
		return nil, true
	}
	fmt.Printf("chaos: scheduler: %d ticks in %d trials (%d pauses, %d kills): %d run once, %d duplicated, %d missed; %d finished by another instance at the cursor\n",
		rep.Ticks, rep.Trials, rep.Pauses, rep.Kills, rep.Once, rep.Duplicated, rep.Missed, rep.Resumed)
	if rep.Failed() {
		fmt.Printf("chaos: FAIL: a tick ran twice or not at all (seed %d): %s\n", cfg.Seed, rep.FirstBad)
		failed = true
	}
	return rep, failed
}

// verdict prints why a run fails, if it does.
func verdict(cfg chaos.Config, rep *chaos.Report, seed int64) bool {
	failed := false
	if cfg.Guard && rep.Violations > 0 {
		fmt.Printf("chaos: FAIL: %d violations with guard on (seed %d)\n", rep.Violations, seed)
		failed = true
	}
	if rep.Errors > 0 {
		fmt.Printf("chaos: FAIL: %d trials could not run or inject their fault\n", rep.Errors)
		failed = true
	}
	return failed
}
