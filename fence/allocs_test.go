package fence_test

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// Heap allocations per uncontended acquire+release, as measured: the
// client's whole share, go-redis's included (an EVALSHA's arguments, its
// reply, the pool's connection check), so that a change on either side
// shows. Lower them here when a change saves some; a rise needs a reason
// in the commit that raises them. BenchmarkAcquireRelease and
// BenchmarkAcquireWaitingRelease report the same figures (-benchmem).
//
// Of TryAcquire+Release's 32 (go-redis v9.23), go-redis makes 24: per
// EVALSHA, its arguments (the slice, the command name, the hash and the
// four keys boxed) and its Cmd, twice; the two replies; the pool's health
// check of the connection it hands out (6). fence makes 8: the holder id
// and its boxed copy, the acquire arguments, the keys (2), the Lock and
// its value boxed, and the release's context (the caller's values with
// the client's shared bound). The lock's context is made only when asked
// for (Lock.Context, Done, Do). Acquire adds 1: its first attempt's
// context, the caller's values with the client's shared wait bound (a
// context with a timer of the call's own, 4, before sharedBound.until).
var allocsPinned = map[string]float64{
	"TryAcquire+Release": 32,
	"Acquire+Release":    33,
}

// TestAllocsPerAcquireRelease fails when an acquire+release allocates more
// than allocsPinned says. Not parallel: testing.AllocsPerRun counts every
// allocation of the process, so it runs while no parallel test does.
// The race detector's build allocates a little more, so there the limit
// is allocsPinned plus the difference measured under -race (raceSlack).
func TestAllocsPerAcquireRelease(t *testing.T) {
	r := testenv.NewRedis(t)
	c := newClient(t, r, nil)
	ctx := context.Background()
	ops := map[string]func(string) (*fence.Lock, error){
		"TryAcquire+Release": func(name string) (*fence.Lock, error) { return c.TryAcquire(ctx, name) },
		"Acquire+Release":    func(name string) (*fence.Lock, error) { return c.Acquire(ctx, name) },
	}
	for name, acquire := range ops {
		var failed error
		got := testing.AllocsPerRun(200, func() {
			l, err := acquire("allocs")
			if err == nil {
				err = l.Release(ctx)
			}
			if err != nil && failed == nil {
				failed = err
			}
		})
		if failed != nil {
			t.Fatalf("%s: %v", name, failed)
		}
		limit := allocsPinned[name] + raceSlack
		t.Logf("%s: %.0f allocations (pinned: %.0f, limit here: %.0f)", name, got, allocsPinned[name], limit)
		if got > limit {
			t.Errorf("%s allocates %.0f times, more than the %.0f pinned: find the new allocation (go test -run '^$' -bench AcquireRelease -benchmem -memprofile mem.out -memprofilerate 1 ./fence/, then go tool pprof -sample_index alloc_objects), or raise allocsPinned saying why", name, got, limit)
		}
	}
}
