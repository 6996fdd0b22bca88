// Command chaos runs the fault-injection suite of fencelock: worker
// processes doing fenced read-modify-write and append work while a nemesis
// injects faults, then a history checker (direct checks and a
// linearizability check) on every trial. See package chaos.
//
//	go run -race ./chaos/cmd/chaos -trials 200 -seed 42
//
// It exits 1 when guard-on trials found violations, when the guard-off
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
	"strings"
	"time"

	"github.com/fencelock/fencelock/chaos"
)

func main() {
	if chaos.IsWorker() {
		// Re-executed by the suite as one of its workers.
		os.Exit(chaos.WorkerMain())
	}
	var (
		trials    = flag.Int("trials", 200, "randomized trials with guard on (one fault each)")
		seed      = flag.Int64("seed", 0, "seed of the fault schedule and the workers' choices (0: from the clock; printed)")
		kinds     = flag.String("kinds", "", "comma-separated fault kinds (default all: "+strings.Join(chaos.FaultKinds, ",")+")")
		control   = flag.Int("control", 9, "trials of the guard-off control run after the main run (0: none)")
		guardOn   = flag.Bool("guard", true, "fence the workers' writes with guard (false: the main run is a control run)")
		lease     = flag.Duration("lease", 400*time.Millisecond, "lock lease")
		bare      = flag.Bool("bare-lease", true, "odd-numbered workers give guard.Exec a bare lease (no Done channel): the database alone must reject their stale writes")
		idle      = flag.Duration("idle-timeout", 0, "pgfence.WithIdleTimeout for the workers' stores (0: off, the library default)")
		workers   = flag.Int("workers", 3, "worker processes per trial")
		resources = flag.Int("resources", 2, "resources per trial")
		verbose   = flag.Bool("v", false, "one line per trial")
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
	cfg := chaos.Config{Trials: *trials, Seed: *seed, Guard: *guardOn, Kinds: ks, Workers: *workers,
		Resources: *resources, Lease: *lease, IdleTimeout: *idle, BareLeases: *bare, WorkerCommand: chaos.SelfCommand, Verbose: *verbose}
	fmt.Printf("chaos: seed %d (rerun with -seed %d)\n", *seed, *seed)
	failed := false
	if *control > 0 {
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
	rep, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		os.Exit(1)
	}
	if cfg.Guard && rep.Violations > 0 {
		fmt.Printf("chaos: FAIL: %d violations with guard on (seed %d)\n", rep.Violations, *seed)
		failed = true
	}
	if rep.Errors > 0 {
		fmt.Printf("chaos: FAIL: %d trials could not run or inject their fault\n", rep.Errors)
		failed = true
	}
	if failed {
		// Keep the JSON summary of the main run the last line of stdout.
		b, _ := json.Marshal(rep.Summary())
		fmt.Println(string(b))
		os.Exit(1)
	}
}
