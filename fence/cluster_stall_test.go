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
