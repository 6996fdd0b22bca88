package fence_test

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
)

// Helpers of the tests on multi-node deployments (Cluster, Sentinel).

// uniquePrefix is a key prefix of the test's own, for servers shared
// between tests.
func uniquePrefix(t testing.TB) string {
	return t.Name() + "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + ":"
}

// newFenceOn returns a fence client on rdb with prefix, closed at the end
// of the test.
func newFenceOn(t testing.TB, rdb redis.UniversalClient, prefix string, opts ...fence.ClientOption) *fence.Client {
	t.Helper()
	c, err := fence.New(rdb, append([]fence.ClientOption{fence.WithPrefix(prefix)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// namesPerMaster returns n lock names for each master of cc, keyed by the
// master's address: names whose keys (prefix+"{name}") hash to its slots.
func namesPerMaster(t testing.TB, cc *redis.ClusterClient, prefix, stem string, n int) map[string][]string {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	var count atomic.Int64 // ForEachMaster runs concurrently
	require.NoError(t, cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { count.Add(1); return nil }))
	masters := int(count.Load())
	out := map[string][]string{}
	for i, full := 0, 0; full < masters; i++ {
		require.Less(t, i, 100000, "no names found for every master")
		name := stem + strconv.Itoa(i)
		node, err := cc.MasterForKey(ctx, prefix+"{"+name+"}")
		require.NoError(t, err)
		a := node.Options().Addr
		if len(out[a]) < n {
			out[a] = append(out[a], name)
			if len(out[a]) == n {
				full++
			}
		}
	}
	return out
}

// shardSubscribers is the number of sharded subscribers of channel on
// node.
func shardSubscribers(ctx context.Context, node *redis.Client, channel string) int64 {
	v, err := node.Do(ctx, "PUBSUB", "SHARDNUMSUB", channel).Slice()
	if err != nil || len(v) != 2 {
		return -1
	}
	n, _ := v[1].(int64)
	return n
}

// waitDialProbes registers a cleanup, run after the test's clients are
// closed, that waits for go-redis's dial probes of dead nodes to end:
// each sleeps up to 1 s before it sees its closed pool, longer than the
// leak check at the end of the package waits.
func waitDialProbes(t *testing.T) {
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		buf := make([]byte, 1<<20)
		for time.Now().Before(deadline) {
			n := runtime.Stack(buf, true)
			if !bytes.Contains(buf[:n], []byte("(*ConnPool).tryDial")) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

type acquired struct {
	l   *fence.Lock
	err error
	at  time.Time
}

// failoverTimes are the moments of a failover as a fence user sees them.
type failoverTimes struct {
	promoted time.Time // the failover is done (see watchFailover)
	renewed  time.Time // a renewal of held that started after the kill succeeded
	back     time.Time // try succeeded for the first time
}

// watchFailover follows a failover that began at killed: it polls done
// (the failover is complete: the deployment names the new master) and
// held's deadline every 2 ms on a goroutine of its own, and calls try (an
// acquisition on the dead master's slots) until it succeeds; each lasts up
// to 30 s. It checks that acquisitions and renewals are back within bound
// of the failover.
func watchFailover(t *testing.T, killed time.Time, done func(context.Context) bool, held *fence.Lock, lease, bound time.Duration, try func(i int) error) failoverTimes {
	t.Helper()
	ctx := ctxT(t, 40*time.Second)
	var (
		mu sync.Mutex
		ft failoverTimes
	)
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		// A renewal that started after the kill moves the deadline past this.
		mark := killed.Add(lease - lease/100 - 2*time.Millisecond)
		for {
			master := done(ctx)
			renewed := held.Deadline().After(mark)
			now := time.Now()
			mu.Lock()
			if master && ft.promoted.IsZero() {
				ft.promoted = now
			}
			if renewed && ft.renewed.IsZero() {
				ft.renewed = now
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	var back time.Time
	for i := 0; back.IsZero() && time.Since(killed) < 30*time.Second; i++ {
		if try(i) == nil {
			back = time.Now()
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !ft.promoted.IsZero() && !ft.renewed.IsZero()
	}, 30*time.Second, 5*time.Millisecond, "failover done and held lock renewed within 30 s")
	close(stop)
	<-watched
	ft.back = back
	require.False(t, back.IsZero(), "no acquisition within 30 s of the kill")
	t.Logf("kill → failover done %v; acquisitions back %v after it; held lock renewed %v after it",
		ft.promoted.Sub(killed), ft.back.Sub(ft.promoted), ft.renewed.Sub(ft.promoted))
	assert.Less(t, ft.back.Sub(ft.promoted), bound, "acquisitions back within the failover + %v", bound)
	assert.Less(t, ft.renewed.Sub(ft.promoted), bound, "renewals back within the failover + %v", bound)
	return ft
}

// failoverLease is the holder's lease in the failover tests. Its
// renewals (every lease/3) are spaced well apart from the failover so the
// two mechanisms a waiter may wake by are far apart: the release message
// (milliseconds) and its PTTL timer, which cannot fire before the held
// key's first expiry, a lease after it was acquired (see
// assertWokenByRelease).
const failoverLease = 24 * time.Second

// failoverBound bounds how long after a failover acquisitions and
// renewals work again: fence reloads the slot map itself on MOVED and
// connection errors, well before go-redis's periodic refresh (60 s), which
// the bound stays far below. Wide, so that a loaded machine does not fail
// it; the figures are logged.
const failoverBound = 10 * time.Second

// sleepUntilRenewalDue sleeps until shortly before held's next renewal
// falls due (lease/3 after its last renewal or acquisition began), so that
// a failover the caller starts next is still on when it does.
func sleepUntilRenewalDue(held *fence.Lock, lease time.Duration) {
	lastStart := held.Deadline().Add(-lease + lease/100 + 2*time.Millisecond)
	time.Sleep(time.Until(lastStart.Add(lease/3 - 300*time.Millisecond)))
}

// assertWokenByRelease checks that a waiter that acquired at `at` was
// woken by the release message sent at released, not by its PTTL timer:
// that timer fires no earlier than the key expiry the waiter's last
// attempt saw, and the held key (acquired at heldSince with lease) never
// expires before heldSince+lease, as renewals only push its expiry later.
func assertWokenByRelease(t *testing.T, heldSince, released, at time.Time, lease time.Duration) {
	t.Helper()
	timerEarliest := heldSince.Add(lease)
	wake := at.Sub(released)
	t.Logf("waiter acquired %v after the release; its PTTL timer could not fire before %v after the release",
		wake, timerEarliest.Sub(released).Round(time.Millisecond))
	assert.True(t, at.Before(timerEarliest), "woken by the release message, not by the expiry timer: acquired %v after the release, %v after the held key's first expiry",
		wake, at.Sub(timerEarliest))
	assert.Less(t, wake, 5*time.Second, "woken promptly by the release message")
}

// recommendedDialerRetries is the go-redis DialerRetries docs/cluster-and-sentinel.md
// recommends for cluster clients with fence: fence retries by itself, and
// go-redis's dial retries of a dead master (5, 100 ms apart) delay how
// soon the slot map, and fence's calls, reach the promoted one.
const recommendedDialerRetries = 1

// isMaster reports whether the node says it is a master.
func isMaster(ctx context.Context, rdb *redis.Client) bool {
	s, err := rdb.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(s, "role:master")
}
