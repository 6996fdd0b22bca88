package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/fencelock/fencelock/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(waiterProcEnv) != "" {
		waiterMain() // a waiter process of the headkill scenario
		return
	}
	testenv.Main(m)
}

// TestHarnessQuick runs every scenario at toy sizes: it checks that the
// harness works end to end (servers, all three libraries, Postgres, the
// goals), not the figures, which mean nothing at these sizes.
func TestHarnessQuick(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log io.Writer = io.Discard
	if testing.Verbose() {
		log = os.Stderr
	}
	res, err := run(ctx, quickConfig(), false, "", log)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rtt", "uncontended", "parallel", "handoff", "handoff2", "fair", "queue", "headkill", "contended", "renewal", "guard", "sqlfence", "sync", "outbox", "cluster"} {
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
