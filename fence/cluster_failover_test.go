package fence_test

import (
	"context"
	"strings"
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
//   - acquisitions on the dead master's slots work again within a second
//     of the promotion (before: "connection refused" for about a minute,
//     until go-redis's periodic slot-map refresh);
//   - a lock held through the failover, whose key had reached the replica,
//     survives it (before: lost);
//   - an Acquire waiting with a 40 s context waits through the failover
//     instead of returning "connection refused";
//   - that waiter moves its subscription to the promoted master and is
//     woken there by the release message, not by its expiry timer.
func TestClusterFailover(t *testing.T) {
	t.Parallel() // with the other fault tests on private topologies: they mostly wait
	waitDialProbes(t)
	cl := testenv.NewRedisCluster(t) // 3 masters, 1 replica each, node timeout 1 s
	ctx := ctxT(t, 90*time.Second)
	prefix := uniquePrefix(t)
	const lease = 10 * time.Second // outlives the failover
	holder := newFenceOn(t, cl.NewClient(nil), prefix, fence.WithLease(lease))
	waiter := newFenceOn(t, cl.NewClient(nil), prefix, fence.WithLease(lease))
	victim, replica := cl.Nodes[0], cl.Nodes[3] // replicas of master i follow the masters
	names := namesPerMaster(t, cl.Client(), prefix, "f", 40)[victim.Addr]
	require.NotEmpty(t, names)
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

	killed := time.Now()
	require.NoError(t, victim.Kill())
	// Until the replica says it is master (it then accepts writes), and
	// until an acquisition on the victim's slots works: other names, so
	// that the held one stays held.
	var promoted, back time.Time
	for i := 1; (promoted.IsZero() || back.IsZero()) && time.Since(killed) < 30*time.Second; i = i%(len(names)-1) + 1 {
		if promoted.IsZero() && isMaster(ctx, replica.Client()) {
			promoted = time.Now()
		}
		if back.IsZero() {
			actx, cancel := context.WithTimeout(ctx, time.Second)
			l, err := holder.TryAcquire(actx, names[i])
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

	// The waiter still waits, now subscribed on the promoted master.
	require.Eventually(t, func() bool { return shardSubscribers(ctx, replica.Client(), channel) == 1 },
		10*time.Second, 5*time.Millisecond, "the waiter resubscribed on the promoted master")
	t.Logf("waiter resubscribed %v after the kill", time.Since(killed))
	select {
	case a := <-got:
		t.Fatalf("Acquire returned during the failover: %v, %v", a.l, a.err)
	default:
	}

	// The held lock survived (renewed on the promoted master); its
	// release wakes the waiter by message: its expiry timer is ~10 s off.
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

// isMaster reports whether the node says it is a master.
func isMaster(ctx context.Context, rdb *redis.Client) bool {
	s, err := rdb.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(s, "role:master")
}
