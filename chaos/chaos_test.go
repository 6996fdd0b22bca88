package chaos

import (
	"bytes"
	"context"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/outbox/outboxtest"
	"github.com/fencelock/fencelock/testenv"
	"github.com/fencelock/fencelock/tick/ticktest"
)

var (
	flagTrials = flag.Int("chaos.trials", 0, "trials of TestChaos (default: one per fault kind)")
	flagSeed   = flag.Int64("chaos.seed", 1, "seed of TestChaos and TestChaosControl")
	flagVerb   = flag.Bool("chaos.v", false, "print one line per trial")
)

func TestMain(m *testing.M) {
	if IsWorker() {
		// This process is a worker re-executed by the suite, not a test run.
		os.Exit(WorkerMain())
	}
	if outboxtest.IsRelayProcess() {
		os.Exit(outboxtest.RelayMain())
	}
	if ticktest.IsInstance() {
		os.Exit(ticktest.InstanceMain())
	}
	testenv.Main(m)
}

func testCommandConfig(t *testing.T, guardOn bool, trials int, kinds []string) (Config, *bytes.Buffer) {
	var out bytes.Buffer
	return Config{
		Trials: trials, Seed: *flagSeed, Guard: guardOn, Kinds: kinds,
		WorkerCommand: SelfCommand, Out: &out, Verbose: *flagVerb,
	}, &out
}

// TestChaos is the short, seeded version of `make chaos`: every fault kind
// at least once with guard on, and not one violation. As in `make chaos`,
// half the workers pass the *fence.Lock to guard.Exec, as applications do,
// and half a bare lease, so that only the database can stop their late
// writes.
func TestChaos(t *testing.T) {
	trials := *flagTrials
	if trials == 0 {
		trials = len(FaultKinds)
	}
	cfg, out := testCommandConfig(t, true, trials, nil)
	cfg.BareLeases = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	for _, k := range FaultKinds {
		if trials < len(FaultKinds) {
			break // a shortened run (flag) cannot cover every kind
		}
		if st := rep.PerKind[k]; st.Faults == 0 {
			t.Errorf("fault %s was never injected (%d trials, %d errors)", k, st.Trials, st.Errors)
		}
	}
	if rep.Summary().Ops == 0 {
		t.Fatalf("no operations were checked")
	}
	if rep.Violations != 0 {
		t.Errorf("%d violations with guard on (seed %d): see the history slices above", rep.Violations, cfg.Seed)
	}
	if rep.Errors != 0 {
		t.Errorf("%d trials could not run or inject their fault", rep.Errors)
	}
	last := strings.TrimSpace(out.String())
	last = last[strings.LastIndexByte(last, '\n')+1:]
	if !strings.HasPrefix(last, "{") {
		t.Errorf("last output line is not the JSON summary: %q", last)
	}
}

// TestChaosControl runs the same suite with guard off (plain transactions
// under the lock) against holders paused beyond their lease: the checker
// must report violations, or it proves nothing.
func TestChaosControl(t *testing.T) {
	// One SIGSTOP trial lets a stale write land in most runs, not all (the
	// frozen holder may be between operations, or its operation may time
	// out while frozen): run trials until one shows violations, bounded.
	const maxTrials = 8
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i := 0; i < maxTrials; i++ {
		cfg, out := testCommandConfig(t, false, 1, []string{FaultSigstop})
		cfg.Seed += int64(i)
		rep, err := Run(ctx, cfg)
		if err != nil {
			t.Log("\n" + out.String())
			t.Fatalf("chaos run: %v", err)
		}
		if rep.Violations == 0 {
			continue
		}
		t.Log("\n" + out.String())
		if !strings.Contains(out.String(), "chaos: VIOLATION trial") || !strings.Contains(out.String(), "history (ms relative to the fault)") {
			t.Errorf("a failing run must print the seed and the offending history slice")
		}
		return
	}
	t.Fatalf("guard off under SIGSTOP beyond the lease: the checker found no violation in %d trials", maxTrials)
}

// TestChaosCluster is the short version of `make chaos`'s cluster run: each
// cluster fault once (a master killed, stalled, lost with writes its replica
// missed, cut off from the workers; a replica stopped while another master
// fails over), guard on, and not one violation.
func TestChaosCluster(t *testing.T) {
	t.Parallel()
	trials := *flagTrials
	if trials == 0 {
		trials = len(ClusterFaultKinds)
	}
	cfg, out := testCommandConfig(t, true, trials, nil)
	cfg.Cluster, cfg.BareLeases = true, true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	for _, k := range ClusterFaultKinds {
		if trials < len(ClusterFaultKinds) {
			break
		}
		if st := rep.PerKind[k]; st.Faults == 0 {
			t.Errorf("fault %s was never injected (%d trials, %d errors)", k, st.Trials, st.Errors)
		}
	}
	if rep.Summary().Ops == 0 {
		t.Fatalf("no operations were checked")
	}
	if rep.Violations != 0 {
		t.Errorf("%d violations with guard on (seed %d): see the history slices above", rep.Violations, cfg.Seed)
	}
	if rep.Errors != 0 {
		t.Errorf("%d trials could not run or inject their fault", rep.Errors)
	}
}

// TestChaosClusterControl: guard off, a failover to a replica that missed
// the last lock lets two holders work at once; the checker must see it.
func TestChaosClusterControl(t *testing.T) {
	t.Parallel()
	const maxTrials = 6
	cfg, out := testCommandConfig(t, false, maxTrials, []string{FaultClusterLossy})
	cfg.Cluster, cfg.StopAtViolation = true, true
	cfg.Lease = clusterControlLease
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	if rep.Violations == 0 {
		t.Fatalf("guard off, lossy failover: the checker found no violation in %d trials", rep.Trials)
	}
}
