package fence_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// TestClusterFailover kills a master whose replica then takes over, and
// checks what a fence user sees:
//   - acquisitions and renewals on the dead master's slots work again
//     within failoverBound of the promotion, typically under a second
//     (before: "connection refused" for about a minute, until go-redis's
//     periodic slot-map refresh);
//   - a lock held through the failover, whose key had reached the replica,
//     survives it (before: lost);
//   - an Acquire waiting with a 40 s context waits through the failover
//     instead of returning "connection refused";
//   - that waiter moves its subscription to the promoted master and is
//     woken there by the release message, not by its expiry timer
//     (which cannot fire before the held key's first expiry, a 24 s lease
//     after it was acquired).
func TestClusterFailover(t *testing.T) {
	t.Parallel() // with the other fault tests on private topologies: they mostly wait
	waitDialProbes(t)
	cl := testenv.NewRedisCluster(t) // 3 masters, 1 replica each, node timeout 1 s
	ctx := ctxT(t, 90*time.Second)
	prefix := uniquePrefix(t)
	// Outlives the failover; its renewal is timed to fall due during it.
	const lease = failoverLease
	opts := func() *redis.ClusterOptions { return &redis.ClusterOptions{DialerRetries: recommendedDialerRetries} }
	holder := newFenceOn(t, cl.NewClient(opts()), prefix, fence.WithLease(lease))
	waiter := newFenceOn(t, cl.NewClient(opts()), prefix, fence.WithLease(lease))
	victim, replica := cl.Nodes[0], cl.Nodes[3] // replicas of master i follow the masters
	names := namesPerMaster(t, cl.Client(), prefix, "f", 40)[victim.Addr]
	require.NotEmpty(t, names)
	heldSince := time.Now()
	held, err := holder.Acquire(ctx, names[0], fence.WithReplicaSync(1, 5*time.Second))
	require.NoError(t, err)
	channel := prefix + "{" + names[0] + "}:ch"

	got := make(chan acquired, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 40*time.Second)
		defer cancel()
		l, err := waiter.Acquire(wctx, names[0])
		got <- acquired{l, err, time.Now()}
	}()
	require.Eventually(t, func() bool { return shardSubscribers(ctx, victim.Client(), channel) == 1 },
		10*time.Second, 5*time.Millisecond, "the waiter subscribed on the victim")

	sleepUntilRenewalDue(held, lease)
	killed := time.Now()
	require.NoError(t, victim.Kill())
	// The failover is done when the replica says it is master: it won the
	// election and tells the other nodes at once. Acquisitions try other
	// names on the victim's slots: the held one stays held.
	promoted := func(ctx context.Context) bool { return isMaster(ctx, replica.Client()) }
	ft := watchFailover(t, killed, promoted, held, lease, failoverBound, func(i int) error {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		l, err := holder.TryAcquire(actx, names[1+i%(len(names)-1)])
		if err == nil {
			require.NoError(t, l.Release(ctx))
		}
		return err
	})

	// The waiter still waits, now subscribed on the promoted master.
	require.Eventually(t, func() bool { return shardSubscribers(ctx, replica.Client(), channel) == 1 },
		10*time.Second, 5*time.Millisecond, "the waiter resubscribed on the promoted master")
	t.Logf("waiter resubscribed %v after the promotion", time.Since(ft.promoted))
	select {
	case a := <-got:
		t.Fatalf("Acquire returned during the failover: %v, %v", a.l, a.err)
	default:
	}

	// The held lock survived (renewed on the promoted master); its
	// release wakes the waiter by message: its expiry timer is seconds away.
	require.NoError(t, held.Err(), "a lock whose key reached the replica survives the failover")
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	a := <-got
	require.NoError(t, a.err)
	assertWokenByRelease(t, heldSince, released, a.at, lease)
	assert.Greater(t, a.l.Token(), held.Token())
	require.NoError(t, a.l.Release(ctx))
}
