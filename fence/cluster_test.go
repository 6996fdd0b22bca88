package fence_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// TestCluster runs the lock on a real one-node Redis Cluster (all 16384
// slots on one server): the cluster code paths — sharded pub/sub
// (SSUBSCRIBE/SPUBLISH), WAIT on the key's master, pipelines split per
// node — against a real server.
func TestCluster(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t, testenv.WithRedisArgs("--cluster-enabled", "yes"))
	ctx := ctxT(t, 30*time.Second)
	require.NoError(t, r.Client().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err())
	require.Eventually(t, func() bool {
		info, err := r.Client().ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	}, 10*time.Second, 50*time.Millisecond)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{r.Addr}})
	t.Cleanup(func() { _ = cc.Close() })

	rec1, rec2 := newRecorder(), newRecorder()
	c1 := newClient(t, r, cc, fence.WithObserver(rec1))
	c2 := newClient(t, r, cc, fence.WithObserver(rec2))
	l, err := c1.Acquire(ctx, "cl", fence.WithLease(time.Minute)) // only the release message hands it over fast
	require.NoError(t, err)
	short, err := c1.Acquire(ctx, "renewed", fence.WithLease(1500*time.Millisecond))
	require.NoError(t, err)
	got := make(chan *fence.Lock, 1)
	go func() {
		l, err := c2.Acquire(ctx, "cl")
		assert.NoError(t, err)
		got <- l
	}()
	rec1.waitCount(t, "renewed", 3) // > one lease of renewals
	require.NoError(t, short.Err(), "renewed by the watchdog through the cluster client")
	rec2.waitCount(t, "waiting", 1)
	require.NoError(t, short.Release(ctx))
	select {
	case <-got:
		t.Fatal("acquired while held")
	default:
	}
	released := time.Now()
	require.NoError(t, l.Release(ctx))
	l2 := <-got
	t.Logf("handoff after release: %v", time.Since(released))
	// Far below the minute-long lease: the sharded release message woke it.
	assert.Less(t, time.Since(released), 5*time.Second)
	require.NotNil(t, l2)
	assert.Greater(t, l2.Token(), l.Token())
	require.NoError(t, l2.Release(ctx))

	// WAIT on the key's master: no replica, so asking for one fails.
	_, err = c1.TryAcquire(ctx, "cl", fence.WithReplicaSync(1, 50*time.Millisecond))
	var rse *fence.ReplicaSyncError
	assert.ErrorAs(t, err, &rse)
	n, err := cc.Exists(ctx, lockKey(r, "cl")).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}
