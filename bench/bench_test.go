package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/testenv"
)

func TestMain(m *testing.M) {
	childMain() // a process of a cross-process scenario: plays its role and exits
	testenv.Main(m)
}

// TestHarnessQuick runs every scenario at toy sizes: it checks that the
// harness works end to end (servers, all three libraries, Postgres, the
// goals), not the figures, which mean nothing at these sizes.
func TestHarnessQuick(t *testing.T) {
	// A bound for a hung harness only: under the whole suite's load on 2
	// cores the toy run takes minutes (it failed its scenarios at a 3
	// minute bound), and a slow machine must not fail it.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var log io.Writer = io.Discard
	if testing.Verbose() {
		log = os.Stderr
	}
	res, err := run(ctx, quickConfig(), false, "", log)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rtt", "uncontended", "parallel", "shapes", "handoff", "handoff2", "fair", "queue", "headkill", "election", "leaderkill", "observe", "contended", "renewal", "guard", "sqlfence", "sync", "tick", "outbox", "cluster"} {
		s, ok := res.Scenarios[name]
		if !ok {
			t.Errorf("scenario %s did not run", name)
			continue
		}
		if s.Error != "" {
			t.Errorf("scenario %s: %s", name, s.Error)
		}
	}
	if len(res.Goals) < 15 {
		t.Errorf("only %d goals evaluated", len(res.Goals))
	}
	// Every row of the fair lock's and the outbox's performance tables is
	// a goal of the run.
	for _, want := range []struct{ issue, goal string }{
		{issueFair, "handoff (2 processes), released as soon as the waiter is queued: median ≤ 2 × PING"},
		{issueFair, "handoff (2 processes), released after a 5ms hold: median ≤ 2 × PING after the same idle"},
		{issueFair, "handoff (2 processes) ÷ the PUBLISH floor of the same run ≤ 1.15, released at once"},
		{issueFair, "handoff (2 processes) ÷ the PUBLISH floor after the same idle ≤ 1.15, released after a 5ms hold"},
		{issueFair, "processes × 2 goroutines, 1ms hold: min/max acquisitions per process ≥ 0.9"},
		{issueFair, "grants out of arrival order = 0"},
		{issueFair, "contended acquisitions/s ≥ 0.95 × the best Redis peer (fence/best of redislock, redsync)"},
		{issueFair, "lock server CPU per contended acquisition ≤ the best Redis peer's (fence/best of redislock, redsync)"},
		{issueFair, "Redis CPU per uncontended acquire+release (4 names) ÷ redislock ≤ 1.10"},
		{issueFair, "client CPU per uncontended acquire+release (4 names) ÷ redislock ≤ 1.00"},
		{issueLock, "fence ≤ fastest peer (fence/fastest peer)"},
		{issueFair, "queued waiters: ≤ 200 B of Redis memory per waiter"},
		{issueFair, "queued waiters: median release ≤ 50 µs in SLOWLOG"},
		{issueFair, "5 waiters SIGKILLed at the head (liveness 500ms): the next live waiter holds within 4 s in total"},
		{issueOutbox, "commit → Sender called, in-process wake-up: p50 ≤ 1 ms"},
		{issueOutbox, "commit → Sender called, in-process wake-up: p99 ≤ 5 ms"},
		{issueOutbox, "commit → Sender called, poll-only: p50 ≤ 60 ms"},
		{issueOutbox, "guarded transaction + 1 effect ÷ guarded transaction ≤ 1.05, loopback"},
		{issueOutbox, "guarded transaction + 1 effect ÷ guarded transaction ≤ 1.05, 1 ms proxy"},
		{issueOutbox, "one relay to a no-op Sender ≥ 5,000 effects/s"},
		{issueOutbox, "two relays ≥ 1.6 × one"},
		{issueOutbox, "commit → Sender p50 ≤ ½ of River's"},
		{issueLeader, "resign → the next candidate's Campaign returns: ≤ 1.1 × the fair lock's handoff"},
		{issueLeader, "leader SIGKILLed → next leader, term lease 500ms: ≤ 667ms"},
		{issueLeader, "observe fan-out, 20 observers, a resignation seen by all: p50 ≤ 2 × PING"},
		{issueLeader, "observe fan-out, 20 observers, a resignation seen by all: p99 ≤ 10 × PING"},
		{issueTicks, "a tick run of an empty job ÷ its floor ≤ 1.2"},
	} {
		found := false
		for _, g := range res.Goals {
			found = found || (g.Issue == want.issue && strings.Contains(g.Goal, want.goal))
		}
		if !found {
			t.Errorf("no goal %q (%s)", want.goal, want.issue)
		}
	}
	// The toy run has no etcd peer: make test needs no etcd server.
	if res.Placement.EtcdVersion != "" || res.Scenarios["handoff2"].get(etcdName, gapAtOnce) != nil || res.Scenarios["fair"].get(etcdName, "acq_per_s") != nil {
		t.Error("the quick run used the etcd peer")
	}
	// The fair scenario's Redis peers ran in their contender processes.
	for _, lib := range redisPeers {
		if f := res.Scenarios["fair"].get(lib, "acq_per_s"); f == nil || f.Median <= 0 {
			t.Errorf("fair: no acquisitions/s of %s: %+v", lib, f)
		}
	}
	// Every library's client CPU and context switches in parallel (a
	// window may see no switch: at least it is counted).
	for lib := range res.Scenarios["parallel"].Figures {
		for _, m := range []string{"client_cpu_us_per_op", "client_switches_per_op"} {
			if f := res.Scenarios["parallel"].get(lib, m); f == nil || f.Median < 0 || len(f.Reps) == 0 {
				t.Errorf("parallel: no %s of %s: %+v", m, lib, f)
			}
		}
	}
	// Both handoff variants of fence and the PING (of the floors below).
	for _, row := range []string{"PING", "fence"} {
		for _, m := range []string{gapAtOnce, gapAfterHold} {
			if f := res.Scenarios["handoff2"].get(row, m); f == nil || f.Median <= 0 {
				t.Errorf("handoff2: no %s of %s: %+v", m, row, f)
			}
		}
	}
	// Each floor's gaps and its Redis time per call (Redis counts whole µs
	// per call: a PUBLISH's may sum to 0 over the quick run's two).
	floors := []string{floorName, scriptFloorName}
	for _, st := range handoverSteps {
		floors = append(floors, st.row)
	}
	for _, row := range floors {
		for _, m := range []string{gapAtOnce, gapAfterHold} {
			if f := res.Scenarios["handoff2"].get(row, m); f == nil || f.Median <= 0 {
				t.Errorf("handoff2: no %s of %s: %+v", m, row, f)
			}
		}
		for _, m := range []string{redisAtOnce, redisAfterHold} {
			if f := res.Scenarios["handoff2"].get(row, m); f == nil || f.Median < 0 {
				t.Errorf("handoff2: no %s of %s: %+v", m, row, f)
			}
		}
	}
	for _, g := range res.Goals {
		if g.Met == nil {
			t.Errorf("goal %q of %s was not measured", g.Goal, g.Scenario)
		}
	}
	if f := res.Scenarios["uncontended"].get("fence", "latency_us"); f == nil || f.Median <= 0 {
		t.Errorf("no fence latency: %+v", f)
	}
	var sb stringsBuilder
	printMarkdown(&sb, res)
	if len(sb.b) == 0 {
		t.Error("empty markdown")
	}
	// The charts draw from what this harness records now.
	dir := t.TempDir()
	if err := drawCharts(res, dir); err != nil {
		t.Fatalf("charts from the quick run: %v", err)
	}
	checkCharts(t, dir)
}

type stringsBuilder struct{ b []byte }

func (s *stringsBuilder) Write(p []byte) (int, error) { s.b = append(s.b, p...); return len(p), nil }

// Go benchmarks of the same operations, for benchstat across commits:
//
//	cd bench && go test -run '^$' -bench . -count 10 | tee new.txt
func benchLibs(b *testing.B) []locker {
	r := testenv.NewRedisServer(b)
	f, err := newFenceLocker(r.Addr)
	if err != nil {
		b.Fatal(err)
	}
	libs := []locker{f, newRedsyncLocker(r.Addr), newRedislockLocker(r.Addr, redislockBackoff, "redislock")}
	b.Cleanup(func() {
		for _, l := range libs {
			l.Close()
		}
	})
	return libs
}

func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	for _, l := range benchLibs(b) {
		b.Run(l.Name(), func(b *testing.B) {
			for b.Loop() {
				h, err := l.Acquire(ctx, "bench")
				if err != nil {
					b.Fatal(err)
				}
				if err := h.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkAcquireReleaseParallel(b *testing.B) {
	ctx := context.Background()
	for _, l := range benchLibs(b) {
		b.Run(l.Name(), func(b *testing.B) {
			b.SetParallelism(16)
			var seq int64
			var mu = make(chan struct{}, 1)
			b.RunParallel(func(pb *testing.PB) {
				mu <- struct{}{}
				seq++
				key := fmt.Sprintf("bench:%d", seq)
				<-mu
				for pb.Next() {
					h, err := l.Acquire(ctx, key)
					if err != nil {
						b.Error(err)
						return
					}
					if err := h.Release(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
