package testenv_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

// slotKeys returns one key per master of the cluster, each on a different
// master, found by asking the cluster where candidate keys live.
func keysPerMaster(t *testing.T, ctx context.Context, c *testenv.Cluster, prefix string) map[*testenv.ClusterNode]string {
	t.Helper()
	ms, err := c.Masters(ctx)
	require.NoError(t, err)
	out := map[*testenv.ClusterNode]string{}
	for i := 0; len(out) < len(ms) && i < 1000; i++ {
		k := prefix + strconv.Itoa(i)
		m, err := c.MasterFor(ctx, k)
		require.NoError(t, err)
		if _, ok := out[m]; !ok {
			out[m] = k
		}
	}
	require.Len(t, out, len(ms))
	return out
}

// The shared cluster serves every slot: a key on every slot range can be
// written through the ClusterClient and read back from the master the
// nodes name for it, and the replica has it too.
func TestClusterAnswersOnAllSlots(t *testing.T) {
	start := time.Now()
	c := testenv.SharedRedisCluster(t)
	t.Logf("shared cluster ready in %v", time.Since(start))
	ctx := ctxT(t, 30*time.Second)
	cc := c.Client()
	ms, err := c.Masters(ctx)
	require.NoError(t, err)
	require.Len(t, ms, 3)

	// Every slot: hash tags {0}…{n} spread keys over the slot space; the
	// write must succeed wherever the slot lives.
	served := map[string]int{}
	for i := 0; i < 300; i++ {
		k := fmt.Sprintf("t%d:{%d}", time.Now().UnixNano()%1e6, i)
		require.NoError(t, cc.Set(ctx, k, "v", time.Minute).Err())
		m, err := c.MasterFor(ctx, k)
		require.NoError(t, err)
		got, err := m.Client().Get(ctx, k).Result()
		require.NoError(t, err, "the node the cluster names for %s must hold it", k)
		assert.Equal(t, "v", got)
		served[m.Addr]++
	}
	assert.Len(t, served, 3, "keys land on all three masters")

	// Replication: each master's replica gets its writes.
	for m, k := range keysPerMaster(t, ctx, c, "repl") {
		require.NoError(t, cc.Set(ctx, k, "r", time.Minute).Err())
		reps, err := m.Replicas(ctx)
		require.NoError(t, err)
		require.Len(t, reps, 1)
		require.Eventually(t, func() bool {
			rc := reps[0].NewClient(nil)
			defer rc.Close()
			// A replica answers a readonly connection for its slots.
			return rc.Process(ctx, redis.NewStatusCmd(ctx, "READONLY")) == nil &&
				rc.Get(ctx, k).Val() == "r"
		}, 5*time.Second, 20*time.Millisecond)
	}

	// All 16384 slots are covered by the masters. (CLUSTER SLOTS lists a
	// replica only once gossip brought its replication offset, which may
	// take a few node timeouts: not counted here.)
	//lint:ignore SA1019 go-redis reads its slot map with CLUSTER SLOTS: the coverage clients see
	slots, err := cc.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	covered := 0
	for _, s := range slots {
		covered += int(s.End-s.Start) + 1
		require.NotEmpty(t, s.Nodes)
		assert.Contains(t, c.Addrs(), s.Nodes[0].Addr)
	}
	assert.Equal(t, 16384, covered)
}

// Pausing a master for longer than the node timeout makes the cluster
// promote its replica; the client then writes to the promoted node; the
// old master, resumed, rejoins as a replica.
func TestClusterPauseMasterFailsOver(t *testing.T) {
	t.Parallel()
	c := testenv.NewRedisCluster(t)
	ctx := ctxT(t, 60*time.Second)
	// Short timeouts: a command sent to the paused master fails fast and
	// the retry reloads the slot map.
	cc := c.NewClient(&redis.ClusterOptions{ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})
	m, err := c.MasterFor(ctx, "{p}k")
	require.NoError(t, err)
	require.NoError(t, cc.Set(ctx, "{p}k", "before", 0).Err())
	reps, err := m.Replicas(ctx)
	require.NoError(t, err)
	require.Len(t, reps, 1)
	acked, err := m.Client().Do(ctx, "WAIT", 1, 5000).Int()
	require.NoError(t, err)
	require.Equal(t, 1, acked, "the replica must have the key before the fault")

	paused := time.Now()
	require.NoError(t, m.Pause())
	promoted, err := c.WaitFailover(ctx, m)
	require.NoError(t, err)
	t.Logf("pause master: replica promoted after %v (node timeout 1s)", time.Since(paused))
	assert.Same(t, reps[0], promoted)
	require.Eventually(t, func() bool {
		cc.ReloadState(ctx)
		return cc.Set(ctx, "{p}k", "after", 0).Err() == nil
	}, 20*time.Second, 50*time.Millisecond)
	got, err := promoted.Client().Get(ctx, "{p}k").Result()
	require.NoError(t, err)
	assert.Equal(t, "after", got, "the write went to the promoted replica")

	require.NoError(t, m.Resume())
	require.NoError(t, c.WaitHealthy(ctx))
	isMaster, err := m.IsMaster(ctx)
	require.NoError(t, err)
	assert.False(t, isMaster, "the old master rejoins as a replica")
}

// Killing a master: its replica is promoted, and a restart brings the old
// master back as the new master's replica.
func TestClusterKillAndRestart(t *testing.T) {
	t.Parallel()
	c := testenv.NewRedisCluster(t)
	ctx := ctxT(t, 60*time.Second)
	m, err := c.MasterFor(ctx, "{k}k")
	require.NoError(t, err)
	pid := m.PID()
	killed := time.Now()
	require.NoError(t, m.Kill())
	assert.False(t, testenv.ProcessAlive(pid))
	promoted, err := c.WaitFailover(ctx, m)
	require.NoError(t, err)
	t.Logf("kill master: replica promoted after %v (node timeout 1s)", time.Since(killed))
	now, err := c.MasterFor(ctx, "{k}k")
	require.NoError(t, err)
	assert.Same(t, promoted, now)

	require.NoError(t, m.Restart(false))
	require.NoError(t, c.WaitHealthy(ctx))
	reps, err := promoted.Replicas(ctx)
	require.NoError(t, err)
	assert.Equal(t, []*testenv.ClusterNode{m}, reps, "the restarted node follows the promoted one")
}

// CLUSTER FAILOVER in its three forms swaps master and replica, the last
// two also with the master paused.
func TestClusterForcedFailover(t *testing.T) {
	t.Parallel()
	c := testenv.NewRedisCluster(t, testenv.WithNodeTimeout(5*time.Second))
	ctx := ctxT(t, 60*time.Second)
	for _, mode := range []testenv.FailoverMode{testenv.FailoverGraceful, testenv.FailoverForce, testenv.FailoverTakeover} {
		m, err := c.MasterFor(ctx, "{f}k")
		require.NoError(t, err)
		reps, err := m.Replicas(ctx)
		require.NoError(t, err)
		require.Len(t, reps, 1)
		if mode != testenv.FailoverGraceful {
			// Paused for less than the 5 s node timeout: no automatic
			// failover, only the forced one.
			require.NoError(t, m.Pause())
		}
		start := time.Now()
		require.NoError(t, reps[0].Failover(ctx, mode), "mode %q", mode)
		t.Logf("CLUSTER FAILOVER %s: %v", mode, time.Since(start))
		now, err := c.MasterFor(ctx, "{f}k")
		require.NoError(t, err)
		assert.Same(t, reps[0], now, "mode %q", mode)
		if mode != testenv.FailoverGraceful {
			require.NoError(t, m.Resume())
		}
		require.NoError(t, c.WaitHealthy(ctx))
	}
}

// A replica that misses writes: after MissWrites the master takes a write,
// dies, and the failover to that replica loses the write (and only it).
func TestClusterReplicaMissesWrites(t *testing.T) {
	t.Parallel()
	c := testenv.NewRedisCluster(t)
	ctx := ctxT(t, 60*time.Second)
	cc := c.NewClient(nil)
	m, err := c.MasterFor(ctx, "{w}a")
	require.NoError(t, err)
	reps, err := m.Replicas(ctx)
	require.NoError(t, err)
	require.NoError(t, cc.Set(ctx, "{w}kept", "1", 0).Err())
	require.NoError(t, m.Client().Do(ctx, "WAIT", 1, 5000).Err())

	require.NoError(t, reps[0].MissWrites(ctx, m.Redis))
	require.NoError(t, m.Client().Set(ctx, "{w}lost", "1", 0).Err())
	n, err := m.Client().Do(ctx, "WAIT", 1, 200).Int()
	require.NoError(t, err)
	assert.Zero(t, n, "no replica acknowledged the write")
	require.NoError(t, m.Kill())
	require.NoError(t, reps[0].Resume())
	promoted, err := c.WaitFailover(ctx, m)
	require.NoError(t, err)
	require.Same(t, reps[0], promoted)

	pc := promoted.Client()
	assert.Equal(t, int64(1), pc.Exists(ctx, "{w}kept").Val(), "writes before MissWrites survive")
	assert.Equal(t, int64(0), pc.Exists(ctx, "{w}lost").Val(), "the write after MissWrites is lost")
}

// Without full coverage required, the cluster keeps serving the other
// masters' slots while one master with no replica is down.
func TestClusterWithoutFullCoverage(t *testing.T) {
	t.Parallel()
	c := testenv.NewRedisCluster(t, testenv.WithReplicas(0), testenv.WithRequireFullCoverage(false))
	ctx := ctxT(t, 60*time.Second)
	keys := keysPerMaster(t, ctx, c, "cov")
	var dead *testenv.ClusterNode
	for m := range keys {
		dead = m
		break
	}
	require.NoError(t, dead.Kill())
	cc := c.NewClient(nil)
	for m, k := range keys {
		if m == dead {
			continue
		}
		require.Eventually(t, func() bool { return cc.Set(ctx, k, "v", 0).Err() == nil }, 10*time.Second, 20*time.Millisecond)
	}
	// Once the dead master is failed, the others still say ok (with full
	// coverage they would say fail), and its slots are not served.
	for _, nd := range c.Nodes {
		if nd == dead {
			continue
		}
		require.Eventually(t, func() bool {
			nodes, err := nd.Client().ClusterNodes(ctx).Result()
			return err == nil && strings.Contains(nodes, dead.Addr) && strings.Contains(nodes, "master,fail ")
		}, 10*time.Second, 20*time.Millisecond)
		info, err := nd.Client().ClusterInfo(ctx).Result()
		require.NoError(t, err)
		assert.Contains(t, info, "cluster_state:ok")
	}
	assert.Error(t, cc.Set(ctx, keys[dead], "v", 0).Err())
}

func TestClusterOptionsValidate(t *testing.T) {
	ctx := ctxT(t, 5*time.Second)
	_, err := testenv.StartRedisCluster(ctx, testenv.WithMasters(0))
	assert.ErrorContains(t, err, "at least 1 master")
	_, err = testenv.StartRedisCluster(ctx, testenv.WithNodeTimeout(time.Millisecond))
	assert.ErrorContains(t, err, "at least 100ms")
	// A nil option is an error before anything starts, for every server.
	_, err = testenv.StartRedisCluster(ctx, testenv.WithMasters(3), nil)
	assert.ErrorContains(t, err, "testenv: option 2 of 2 is nil")
	_, err = testenv.StartRedis(nil)
	assert.ErrorContains(t, err, "testenv: option 1 of 1 is nil")
	_, err = testenv.StartSentinel(ctx, nil)
	assert.ErrorContains(t, err, "testenv: option 1 of 1 is nil")
}

// Stop leaves no node running, paused ones included.
func TestClusterNothingLeftAfterCleanup(t *testing.T) {
	var pids []int
	t.Run("inner", func(t *testing.T) {
		c := testenv.NewRedisCluster(t, testenv.WithMasters(1), testenv.WithReplicas(1))
		pids = c.PIDs()
		require.NoError(t, c.Nodes[1].Pause())
	})
	require.Len(t, pids, 2)
	for _, pid := range pids {
		assert.False(t, testenv.ProcessAlive(pid), "cluster node %d outlived cleanup", pid)
	}
}
