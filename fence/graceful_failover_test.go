package fence_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// Graceful failovers: the old master stays up and becomes a replica, so
// no connection breaks. A waiter subscribed on it must still move to the
// new master, where releases are published.

// TestClusterGracefulFailoverWaiter: CLUSTER FAILOVER on the replica; the
// old master drops the subscription (SUNSUBSCRIBE), the waiter moves it to
// the new master and is woken there by the release message.
func TestClusterGracefulFailoverWaiter(t *testing.T) {
	t.Parallel() // with the other fault tests on private topologies
	cl := testenv.NewRedisCluster(t)
	ctx := ctxT(t, 60*time.Second)
	prefix := uniquePrefix(t)
	const lease = failoverLease
	holder := newFenceOn(t, cl.NewClient(nil), prefix, fence.WithLease(lease))
	waiter := newFenceOn(t, cl.NewClient(nil), prefix)
	old, replica := cl.Nodes[0], cl.Nodes[3]
	name := namesPerMaster(t, cl.Client(), prefix, "gf", 1)[old.Addr][0]
	heldSince := time.Now()
	held, err := holder.Acquire(ctx, name, fence.WithReplicaSync(1, 5*time.Second))
	require.NoError(t, err)
	channel := prefix + "{" + name + "}:ch"
	got := make(chan acquired, 1)
	go func() {
		l, err := waiter.Acquire(ctx, name)
		got <- acquired{l, err, time.Now()}
	}()
	require.Eventually(t, func() bool { return shardSubscribers(ctx, old.Client(), channel) == 1 },
		10*time.Second, 5*time.Millisecond, "the waiter subscribed on the old master")
	start := time.Now()
	require.NoError(t, replica.Failover(ctx, testenv.FailoverGraceful))
	require.Eventually(t, func() bool { return shardSubscribers(ctx, replica.Client(), channel) == 1 },
		10*time.Second, 5*time.Millisecond, "the waiter resubscribed on the new master")
	t.Logf("waiter resubscribed %v after the failover began", time.Since(start))
	require.NoError(t, held.Err())
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	a := <-got
	require.NoError(t, a.err)
	assertWokenByRelease(t, heldSince, released, a.at, lease)
	require.NoError(t, a.l.Release(ctx))
}

// TestSentinelGracefulFailoverWaiter: SENTINEL FAILOVER; go-redis leaves a
// failover client's pub/sub connection on the demoted master, so the
// waiter's probe finds it off the master and moves it; the release on the
// new master then wakes it, long before the lock's expiry.
func TestSentinelGracefulFailoverWaiter(t *testing.T) {
	t.Parallel() // with the other fault tests on private topologies
	s := testenv.NewSentinel(t)
	ctx := ctxT(t, 60*time.Second)
	prefix := uniquePrefix(t)
	const lease = failoverLease
	holder := newFenceOn(t, s.NewClient(nil), prefix, fence.WithLease(lease))
	waiter := newFenceOn(t, s.NewClient(nil), prefix)
	old, err := s.Master(ctx)
	require.NoError(t, err)
	heldSince := time.Now()
	held, err := holder.Acquire(ctx, "gsf", fence.WithReplicaSync(1, 5*time.Second))
	require.NoError(t, err)
	channel := prefix + "{gsf}:ch"
	subscribers := func(r *testenv.Redis) int64 {
		n, err := r.Client().PubSubNumSub(ctx, channel).Result()
		if err != nil {
			return -1
		}
		return n[channel]
	}
	got := make(chan acquired, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "gsf")
		got <- acquired{l, err, time.Now()}
	}()
	require.Eventually(t, func() bool { return subscribers(old) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the waiter subscribed on the old master")
	start := time.Now()
	nm, err := s.Failover(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return subscribers(nm) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the waiter resubscribed on the new master")
	t.Logf("waiter resubscribed %v after the failover began", time.Since(start))
	// The holder's renewals reach the new master too: one that began
	// after the failover did succeed (they run every lease/3).
	renewedAfter := start.Add(lease - lease/100 - 2*time.Millisecond)
	require.Eventually(t, func() bool { return held.Deadline().After(renewedAfter) }, lease, 10*time.Millisecond)
	require.NoError(t, held.Err())
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	a := <-got
	require.NoError(t, a.err)
	assertWokenByRelease(t, heldSince, released, a.at, lease)
	require.NoError(t, a.l.Release(ctx))
}
