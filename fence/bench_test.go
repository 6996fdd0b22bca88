package fence_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// BenchmarkAcquireRelease: uncontended TryAcquire + Release on one name,
// one client: two round trips per op.
func BenchmarkAcquireRelease(b *testing.B) {
	r := testenv.NewRedis(b)
	ctx := context.Background()
	c := newClient(b, r, nil)
	b.ReportAllocs()
	for b.Loop() {
		l, err := c.TryAcquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClusterAcquireRelease: uncontended TryAcquire + Release on one
// name, one client, on a Redis Cluster: two round trips per op, each a
// pipeline of one (see Client.runScript).
func BenchmarkClusterAcquireRelease(b *testing.B) {
	cl := testenv.SharedRedisCluster(b)
	ctx := context.Background()
	c := newFenceOn(b, cl.NewClient(nil), uniquePrefix(b))
	b.ReportAllocs()
	for b.Loop() {
		l, err := c.TryAcquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireWaitingRelease: uncontended Acquire (the waiting
// call, as most callers use it) + Release on one name.
func BenchmarkAcquireWaitingRelease(b *testing.B) {
	r := testenv.NewRedis(b)
	ctx := context.Background()
	c := newClient(b, r, nil)
	b.ReportAllocs()
	for b.Loop() {
		l, err := c.Acquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandoff: four workers on two clients contend for one name. An
// op is one acquisition; gap-µs/op is the mean time from a holder's
// Release call to the next (other) worker holding the lock.
func BenchmarkHandoff(b *testing.B) {
	r := testenv.NewRedis(b)
	ctx := context.Background()
	clients := []*fence.Client{newClient(b, r, nil), newClient(b, r, nil)}
	const workers = 4
	var (
		remaining   atomic.Int64
		lastRelease atomic.Int64 // unix ns of the last Release call
		lastOwner   atomic.Int32
		gapSum      atomic.Int64
		gaps        atomic.Int64
		wg          sync.WaitGroup
	)
	remaining.Store(int64(b.N))
	lastOwner.Store(-1)
	b.ResetTimer()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%len(clients)]
			for remaining.Add(-1) >= 0 {
				l, err := c.Acquire(ctx, "handoff", fence.WithWaitLimit(time.Minute))
				if err != nil {
					b.Error(err)
					return
				}
				now := time.Now().UnixNano()
				if prev := lastOwner.Load(); prev >= 0 && prev != int32(w) {
					gapSum.Add(now - lastRelease.Load())
					gaps.Add(1)
				}
				lastOwner.Store(int32(w))
				lastRelease.Store(time.Now().UnixNano())
				if err := l.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if n := gaps.Load(); n > 0 {
		b.ReportMetric(float64(gapSum.Load())/float64(n)/1e3, "gap-µs/op")
		b.ReportMetric(float64(n)/float64(b.N), "handoffs/op")
	}
}

// BenchmarkContended: 16 goroutines of one client on one name, each
// holding the lock 1 ms. An op is one acquisition. cmds/acq counts every
// command the server executed (INFO commandstats, commands inside scripts
// included) per acquisition; min/max is the fewest over the most
// acquisitions of one goroutine (fairness).
func BenchmarkContended(b *testing.B) {
	r := testenv.NewRedis(b)
	ctx := context.Background()
	c := newClient(b, r, nil)
	const workers = 16
	var (
		remaining atomic.Int64
		wg        sync.WaitGroup
		counts    [workers]int64
	)
	remaining.Store(int64(b.N))
	before := commandCalls(b, r)
	b.ResetTimer()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for remaining.Add(-1) >= 0 {
				l, err := c.Acquire(ctx, "contended", fence.WithWaitLimit(time.Minute))
				if err != nil {
					b.Error(err)
					return
				}
				counts[w]++
				time.Sleep(time.Millisecond)
				if err := l.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	after := commandCalls(b, r)
	b.ReportMetric(float64(after-before)/float64(b.N), "cmds/acq")
	if b.N >= 10*workers {
		lo, hi := counts[0], counts[0]
		for _, n := range counts {
			lo, hi = min(lo, n), max(hi, n)
		}
		b.ReportMetric(float64(lo)/float64(hi), "min/max")
	}
}

// commandCalls sums the calls of every command in INFO commandstats.
func commandCalls(b *testing.B, r *testenv.Redis) int64 {
	s, err := r.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(s, "\n") {
		_, rest, ok := strings.Cut(line, ":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			b.Fatalf("commandstats line %q: %v", line, err)
		}
		total += v
	}
	return total
}
