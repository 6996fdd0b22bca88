package fence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// TestClusterStalledMasterCostsOnlyItsLocks: one master of three is
// stopped (SIGSTOP) for three leases. The locks on the other two masters
// keep being renewed; the locks on the stopped one are lost, by their
// local deadline. It pins that a watchdog round sends and applies its
// renewals per node: a round that waited for the stopped master would
// lose every lock on every master.
func TestClusterStalledMasterCostsOnlyItsLocks(t *testing.T) {
	t.Parallel() // with the other fault tests on private topologies: they mostly wait
	// No replicas: nothing takes over the stopped master's slots; and the
	// others keep serving theirs while it is failed (no CLUSTERDOWN).
	cl := testenv.NewRedisCluster(t, testenv.WithReplicas(0), testenv.WithRequireFullCoverage(false))
	cc := cl.NewClient(nil) // go-redis defaults, as an operator would start
	ctx := ctxT(t, 60*time.Second)
	// Renewals every lease/3: a loaded machine may delay one by most of a
	// lease before a healthy lock is lost.
	const lease = 2 * time.Second
	prefix := uniquePrefix(t)
	c := newFenceOn(t, cc, prefix, fence.WithLease(lease))

	stalled := cl.Nodes[0]
	locks := map[string][]*fence.Lock{}
	for addr, ns := range namesPerMaster(t, cc, prefix, "s", 2) {
		for _, n := range ns {
			l, err := c.Acquire(ctx, n)
			require.NoError(t, err)
			locks[addr] = append(locks[addr], l)
		}
	}
	require.Len(t, locks, 3)
	require.Len(t, locks[stalled.Addr], 2)
	var stalledDone []<-chan time.Time
	for _, l := range locks[stalled.Addr] {
		stalledDone = append(stalledDone, doneAt(l))
	}
	stallStart := time.Now()
	require.NoError(t, stalled.Pause())
	t.Cleanup(func() { _ = stalled.Resume() })

	// The stalled master's locks are lost by their local deadlines (at
	// most a lease into the stall); it stays stopped for three leases.
	for i, l := range locks[stalled.Addr] {
		var at time.Time
		select {
		case at = <-stalledDone[i]:
		case <-time.After(time.Until(stallStart.Add(3 * lease))):
			t.Fatalf("lock %s on the stalled master not cancelled within 3 leases of the stall", l.Name())
		}
		require.ErrorIs(t, l.Err(), fence.ErrLockLost, "lock %s on the stalled master", l.Name())
		late := at.Sub(l.Deadline())
		t.Logf("lock %s on the stalled master: cancelled %v into the stall, %v after its local deadline", l.Name(), at.Sub(stallStart), late)
		// Typically a millisecond; a loaded machine delays timers, but
		// not by half a lease. A loss found only when the stalled round
		// gave up (go-redis's read timeout, 5 s by default) would be later.
		assert.LessOrEqual(t, late, lease/2, "loss signalled after the local deadline")
		assert.True(t, l.Deadline().Before(stallStart.Add(lease)), "deadline from a renewal before the stall")
	}
	time.Sleep(time.Until(stallStart.Add(3 * lease)))
	for addr, ls := range locks {
		if addr == stalled.Addr {
			continue
		}
		for _, l := range ls {
			assert.NoError(t, l.Err(), "lock %s on healthy master %s lost while another master was stalled", l.Name(), addr)
			// Renewed during the stall, not merely not yet expired.
			assert.True(t, l.Deadline().After(stallStart.Add(lease)), "lock %s on healthy master %s renewed during the stall", l.Name(), addr)
		}
	}
	require.NoError(t, stalled.Resume())
	for addr, ls := range locks {
		for _, l := range ls {
			err := l.Release(ctx)
			if addr == stalled.Addr {
				assert.True(t, err == nil || errors.Is(err, fence.ErrNotHeld), "release of a lost lock: %v", err)
			} else {
				assert.NoError(t, err)
			}
		}
	}
}

// TestClusterStalledReplicasCostNothing: with every replica stopped
// (SIGSTOP), clients whose only call so far loaded the slot map acquire,
// wait, hand over, refresh and release locks on the healthy masters, and
// renew them, each call within its own bound. go-redis's single-command
// path loads the server's COMMAND table on a client's first call, from
// random nodes, replicas included, bounded only by the read timeout (30 s
// here, past every bound below) and under a client-wide mutex: a call of
// fence that took that path would wait for a stopped replica.
func TestClusterStalledReplicasCostNothing(t *testing.T) {
	t.Parallel() // with the other fault tests on private topologies: they mostly wait
	cl := testenv.NewRedisCluster(t)
	ctx := ctxT(t, 90*time.Second)
	const lease = 2 * time.Second
	prefix := uniquePrefix(t)
	var names []string
	for _, ns := range namesPerMaster(t, cl.Client(), prefix, "r", 2) {
		names = append(names, ns...)
	}
	newC := func() *fence.Client {
		cc := cl.NewClient(&redis.ClusterOptions{ReadTimeout: 30 * time.Second})
		require.NoError(t, cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }), "slot map")
		return newFenceOn(t, cc, prefix, fence.WithLease(lease))
	}
	holders, waiters := make([]*fence.Client, len(names)), make([]*fence.Client, len(names))
	for i := range names {
		holders[i], waiters[i] = newC(), newC()
	}
	for _, r := range cl.Nodes[len(cl.Nodes)/2:] { // replicas of master i follow the masters
		require.NoError(t, r.Pause())
		t.Cleanup(func() { _ = r.Resume() })
	}
	// Each of these clients' first call picks a stopped replica first with
	// a chance of 1/2 on the single-command path.
	bounded := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		t.Cleanup(cancel)
		return c
	}
	var held []*fence.Lock
	for i, name := range names {
		l, err := holders[i].TryAcquire(bounded(), name)
		require.NoError(t, err, "TryAcquire %s", name)
		got := acquireAsync(bounded(), waiters[i], name)
		require.Eventually(t, func() bool {
			info, err := waiters[i].Inspect(bounded(), name)
			return err == nil && info.Waiters == 1
		}, 5*time.Second, 5*time.Millisecond, "the waiter of %s queued", name)
		require.NoError(t, l.Release(bounded()), "Release %s", name)
		a := <-got
		require.NoError(t, a.err, "Acquire %s (handed over)", name)
		assert.Greater(t, a.l.Token(), l.Token())
		held = append(held, a.l)

		f, err := holders[i].TryAcquire(bounded(), name+"-fixed", fence.WithFixedLease(lease))
		require.NoError(t, err, "TryAcquire %s-fixed", name)
		require.NoError(t, f.Refresh(bounded(), lease), "Refresh %s-fixed", name)
		require.NoError(t, f.Release(bounded()), "Release %s-fixed", name)
	}
	renewedAfter := time.Now()
	time.Sleep(2 * lease)
	for _, l := range held {
		require.NoError(t, l.Err(), "lock %s on a healthy master lost while the replicas were stopped", l.Name())
		assert.True(t, l.Deadline().After(renewedAfter.Add(lease)), "lock %s renewed", l.Name())
		require.NoError(t, l.Release(bounded()), "Release %s", l.Name())
	}
}

// TestClusterStalledReplicaDuringFailover: a replica of one master is
// stopped (SIGSTOP) for longer than the lease while another master dies
// and its replica takes over, so that every client must reload its slot
// map while a node of it never answers. go-redis reads the map from one
// node at a time, in random order, replicas included, each for as long as
// the node's ReadTimeout (30 s here); fence bounds each read (topology.go)
// so that the reload moves on to a node that answers. The 30 locks, on
// every master, stay held; a fresh name on each master is acquired and
// released by a client that had its map and by a new one, each well
// within the read timeout; and each of 12 reloads ends within its bound
// (without the bound, one in five waits the 30 s).
func TestClusterStalledReplicaDuringFailover(t *testing.T) {
	t.Parallel() // with the other fault tests on private topologies: they mostly wait
	// Without full coverage the surviving masters serve their slots while
	// the dead one's fail over: what is measured is the stopped replica's
	// cost alone, not the cluster's refusal window.
	cl := testenv.NewRedisCluster(t, testenv.WithRequireFullCoverage(false))
	ctx := ctxT(t, 120*time.Second)
	// A lock on the dying master outlives its failover (about 2 s) and
	// the renewal period (lease/3) before it.
	const lease = 8 * time.Second
	const readTimeout = 30 * time.Second
	prefix := uniquePrefix(t)
	newCC := func() *redis.ClusterClient {
		return cl.NewClient(&redis.ClusterOptions{ReadTimeout: readTimeout, DialerRetries: recommendedDialerRetries})
	}
	// used has its slot map and node clients before New: fence bounds
	// those nodes from New's background check; fresh makes its nodes
	// after New.
	used := newCC()
	require.NoError(t, used.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }))
	holder := newFenceOn(t, used, prefix, fence.WithLease(lease))
	fresh := newFenceOn(t, newCC(), prefix, fence.WithLease(lease))

	names := namesPerMaster(t, cl.Client(), prefix, "rs", 10) // by the master that serves them now
	var held []*fence.Lock
	for _, ns := range names {
		for _, n := range ns {
			l, err := holder.Acquire(ctx, n)
			require.NoError(t, err)
			held = append(held, l)
		}
	}
	require.Len(t, held, 30)
	stopped := cl.Nodes[3] // replicas of master i follow the masters: the replica of Nodes[0]
	victim := cl.Nodes[1]
	stoppedAt := time.Now()
	require.NoError(t, stopped.Pause())
	t.Cleanup(func() { _ = stopped.Resume() })

	require.NoError(t, victim.Kill())
	heir, err := cl.WaitFailover(ctx, victim)
	require.NoError(t, err)
	t.Logf("%s took over from %s %v after the replica %s stopped", heir.Addr, victim.Addr, time.Since(stoppedAt), stopped.Addr)

	// A fresh name in each master's slots, through both clients: each
	// completes well within the read timeout (transient errors while the
	// map is being read again are retried within the bound).
	const bound = 10 * time.Second
	for _, c := range []*fence.Client{holder, fresh} {
		for addr, ns := range names {
			start := time.Now()
			bctx, cancel := context.WithTimeout(ctx, bound)
			l, err := tryUntil(bctx, c, ns[0]+"-fresh")
			require.NoError(t, err, "TryAcquire in the slots of %s", addr)
			require.NoError(t, l.Release(bctx), "Release in the slots of %s", addr)
			cancel()
			t.Logf("a fresh name in the slots of %s: %v", addr, time.Since(start))
		}
	}
	// Reloads of the map: each ends within the bound, although one in five
	// starts with the stopped replica.
	for i := range 12 {
		start := time.Now()
		require.NoError(t, used.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }))
		assert.Less(t, time.Since(start), bound, "slot-map reload %d waited for the stopped replica", i)
	}
	// The replica stays stopped past a lease; every lock is still held and
	// was renewed after the failover.
	renewedAfter := time.Now()
	if wait := time.Until(stoppedAt.Add(lease + time.Second)); wait > 0 {
		time.Sleep(wait)
	}
	for _, l := range held {
		require.NoError(t, l.Err(), "lock %s lost while a replica of another master was stopped", l.Name())
		assert.True(t, l.Deadline().After(renewedAfter), "lock %s renewed after the failover", l.Name())
	}
	for _, l := range held {
		require.NoError(t, l.Release(ctx))
	}
}

// tryUntil retries TryAcquire on transient errors until ctx ends.
func tryUntil(ctx context.Context, c *fence.Client, name string) (*fence.Lock, error) {
	for {
		l, err := c.TryAcquire(ctx, name)
		if err == nil || ctx.Err() != nil {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}
