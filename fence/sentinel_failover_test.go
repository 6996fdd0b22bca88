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
// sentinels promote the replica; acquisitions and renewals work again
// soon after the sentinels name it (within failoverBound; typically under
// a second), a held lock whose key reached the replica survives, a
// waiting Acquire (40 s context) waits through the failover instead of
// returning "connection refused" (before: it returned the error 1.7 s
// in), and its release message on the new master wakes it.
func TestSentinelFailover(t *testing.T) {
	t.Parallel() // with the other fault tests on private topologies: they mostly wait
	waitDialProbes(t)
	s := testenv.NewSentinel(t)
	ctx := ctxT(t, 90*time.Second)
	prefix := uniquePrefix(t)
	// Outlives the failover; its renewal is timed to fall due during it.
	const lease = failoverLease
	// go-redis defaults: fewer retries would only trip its dial breaker
	// sooner (see below).
	holder := newFenceOn(t, s.NewClient(nil), prefix, fence.WithLease(lease))
	wrdb := s.NewClient(nil)
	waiter := newFenceOn(t, wrdb, prefix, fence.WithLease(lease))
	master, err := s.Master(ctx)
	require.NoError(t, err)
	replica, err := s.Replica(ctx)
	require.NoError(t, err)
	heldSince := time.Now()
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

	sleepUntilRenewalDue(held, lease)
	killed := time.Now()
	require.NoError(t, master.Kill())
	// The failover is done when the sentinels name the new master: a
	// failover client connects to whom they name.
	switched := func(ctx context.Context) bool {
		m, err := s.Master(ctx)
		return err == nil && m == replica && isMaster(ctx, replica.Client())
	}
	// Typically tens of ms. But after PoolSize failed dials (20 on 2
	// cores) a go-redis pool stops dialing and probes once a second: then
	// a failover client reaches the new master up to a second after the
	// sentinels name it, whatever fence does.
	ft := watchFailover(t, killed, switched, held, lease, failoverBound, func(i int) error {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		l, err := holder.TryAcquire(actx, "sf-other"+strconv.Itoa(i))
		if err == nil {
			require.NoError(t, l.Release(ctx))
		}
		return err
	})

	require.Eventually(t, func() bool { return subscribers(replica) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the waiter resubscribed on the promoted master")
	t.Logf("waiter resubscribed %v after the promotion", time.Since(ft.promoted))
	select {
	case a := <-got:
		t.Fatalf("Acquire returned during the failover: %v, %v", a.l, a.err)
	default:
	}

	// The waiter's own go-redis pool may still wait for its next dial
	// probe (see above): the wake-up is measured once it can reach the
	// new master.
	require.Eventually(t, func() bool { return wrdb.Ping(ctx).Err() == nil }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, held.Err(), "a lock whose key reached the replica survives the failover")
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	a := <-got
	require.NoError(t, a.err)
	assertWokenByRelease(t, heldSince, released, a.at, lease)
	assert.Greater(t, a.l.Token(), held.Token())
	require.NoError(t, a.l.Release(ctx))
}
