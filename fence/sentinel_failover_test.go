package fence_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// TestSentinelFailover is TestClusterFailover on a Sentinel set with
// failover clients (redis.NewFailoverClient): the master is killed, the
// sentinels promote the replica; acquisitions work again within a second
// of the promotion, a held lock whose key reached the replica survives, a
// waiting Acquire (40 s context) waits through the failover instead of
// returning "connection refused" (before: it returned the error 1.7 s
// in), and its release message on the new master wakes it.
func TestSentinelFailover(t *testing.T) {
	t.Parallel() // with the other fault tests on private topologies: they mostly wait
	waitDialProbes(t)
	s := testenv.NewSentinel(t)
	ctx := ctxT(t, 90*time.Second)
	prefix := uniquePrefix(t)
	const lease = 10 * time.Second // outlives the failover
	holder := newFenceOn(t, s.NewClient(nil), prefix, fence.WithLease(lease))
	waiter := newFenceOn(t, s.NewClient(nil), prefix, fence.WithLease(lease))
	master, err := s.Master(ctx)
	require.NoError(t, err)
	replica, err := s.Replica(ctx)
	require.NoError(t, err)
	held, err := holder.Acquire(ctx, "sf", fence.WithReplicaSync(1, 5*time.Second))
	require.NoError(t, err)
	channel := prefix + "{sf}:ch"
	subscribers := func(r *testenv.Redis) int64 {
		n, err := r.Client().PubSubNumSub(ctx, channel).Result()
		if err != nil {
			return -1
		}
		return n[channel]
	}

	got := make(chan acquired, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 40*time.Second)
		defer cancel()
		l, err := waiter.Acquire(wctx, "sf")
		got <- acquired{l, err, time.Now()}
	}()
	require.Eventually(t, func() bool { return subscribers(master) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the waiter subscribed on the master")

	killed := time.Now()
	require.NoError(t, master.Kill())
	var promoted, back time.Time
	for i := 0; (promoted.IsZero() || back.IsZero()) && time.Since(killed) < 30*time.Second; i++ {
		if promoted.IsZero() && isMaster(ctx, replica.Client()) {
			promoted = time.Now()
		}
		if back.IsZero() {
			actx, cancel := context.WithTimeout(ctx, time.Second)
			l, err := holder.TryAcquire(actx, "sf-other"+strconv.Itoa(i))
			cancel()
			if err == nil {
				back = time.Now()
				require.NoError(t, l.Release(ctx))
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.False(t, promoted.IsZero(), "replica not promoted within 30 s of the kill")
	require.False(t, back.IsZero(), "no acquisition within 30 s of the kill")
	t.Logf("kill → replica promoted %v; kill → acquisitions back %v (promotion + %v)",
		promoted.Sub(killed), back.Sub(killed), back.Sub(promoted))
	assert.Less(t, back.Sub(promoted), time.Second, "acquisitions back within failover + 1 s")

	require.Eventually(t, func() bool { return subscribers(replica) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the waiter resubscribed on the promoted master")
	t.Logf("waiter resubscribed %v after the kill", time.Since(killed))
	select {
	case a := <-got:
		t.Fatalf("Acquire returned during the failover: %v, %v", a.l, a.err)
	default:
	}

	require.NoError(t, held.Err(), "a lock whose key reached the replica survives the failover")
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	a := <-got
	require.NoError(t, a.err)
	wake := a.at.Sub(released)
	t.Logf("waiter acquired %v after the release on the promoted master", wake)
	assert.Less(t, wake, time.Second, "woken by the release message, not by the expiry timer")
	assert.Greater(t, a.l.Token(), held.Token())
	require.NoError(t, a.l.Release(ctx))
}
