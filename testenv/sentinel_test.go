package testenv_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

// SENTINEL FAILOVER switches the master address the sentinels hand out,
// and the failover client follows it.
func TestSentinelFailoverSwitchesMaster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := testenv.NewSentinel(t)
	t.Logf("sentinel set ready in %v", time.Since(start))
	ctx := ctxT(t, 60*time.Second)
	c := s.Client()
	require.NoError(t, c.Set(ctx, "k", "v1", 0).Err())
	old, err := s.Master(ctx)
	require.NoError(t, err)
	require.Same(t, s.Data[0], old)
	got, err := old.Client().Get(ctx, "k").Result()
	require.NoError(t, err)
	assert.Equal(t, "v1", got, "the failover client writes to the master the sentinels name")
	rep, err := s.Replica(ctx)
	require.NoError(t, err)
	require.Same(t, s.Data[1], rep)

	start = time.Now()
	promoted, err := s.Failover(ctx)
	require.NoError(t, err)
	t.Logf("SENTINEL FAILOVER: new master named after %v", time.Since(start))
	assert.Same(t, rep, promoted)
	addr, err := s.Sentinels[0].Client().Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName).StringSlice()
	require.NoError(t, err)
	assert.Equal(t, promoted.Addr, addr[0]+":"+addr[1])

	require.Eventually(t, func() bool { return c.Set(ctx, "k", "v2", 0).Err() == nil }, 20*time.Second, 20*time.Millisecond)
	got, err = promoted.Client().Get(ctx, "k").Result()
	require.NoError(t, err)
	assert.Equal(t, "v2", got, "the client writes to the promoted node")
	require.NoError(t, s.WaitHealthy(ctx), "the old master becomes the new one's replica")
}

// Killing the master: the sentinels promote the replica after down-after;
// the old master, restarted, is turned into the new master's replica.
func TestSentinelKillMaster(t *testing.T) {
	t.Parallel()
	s := testenv.NewSentinel(t)
	ctx := ctxT(t, 60*time.Second)
	old, err := s.Master(ctx)
	require.NoError(t, err)
	pid := old.PID()
	killed := time.Now()
	require.NoError(t, old.Kill())
	assert.False(t, testenv.ProcessAlive(pid))
	promoted, err := s.WaitFailover(ctx, old)
	require.NoError(t, err)
	t.Logf("kill master: sentinels promoted the replica after %v (down-after 2s)", time.Since(killed))
	assert.Same(t, s.Data[1], promoted)

	require.NoError(t, old.Restart(false))
	require.NoError(t, s.WaitHealthy(ctx))
	m, err := s.Master(ctx)
	require.NoError(t, err)
	assert.Same(t, promoted, m)
}

// A replica that misses writes: the write after MissWrites is lost when the
// master dies and the sentinels promote that replica.
func TestSentinelReplicaMissesWrites(t *testing.T) {
	t.Parallel()
	s := testenv.NewSentinel(t)
	ctx := ctxT(t, 60*time.Second)
	m, rep := s.Data[0], s.Data[1]
	c := s.NewClient(&redis.FailoverOptions{})
	require.NoError(t, c.Set(ctx, "kept", "1", 0).Err())
	n, err := m.Client().Do(ctx, "WAIT", 1, 5000).Int()
	require.NoError(t, err)
	require.Equal(t, 1, n)

	require.NoError(t, rep.MissWrites(ctx, m))
	require.NoError(t, c.Set(ctx, "lost", "1", 0).Err())
	require.NoError(t, m.Kill())
	require.NoError(t, rep.Resume())
	promoted, err := s.WaitFailover(ctx, m)
	require.NoError(t, err)
	require.Same(t, rep, promoted)
	assert.Equal(t, int64(1), promoted.Client().Exists(ctx, "kept").Val())
	assert.Equal(t, int64(0), promoted.Client().Exists(ctx, "lost").Val(), "the write after MissWrites is lost")
}

// Stop leaves no process running, paused ones included.
func TestSentinelNothingLeftAfterCleanup(t *testing.T) {
	var pids []int
	t.Run("inner", func(t *testing.T) {
		s := testenv.NewSentinel(t)
		pids = s.PIDs()
		require.NoError(t, s.Sentinels[0].Pause())
		require.NoError(t, s.Data[1].Pause())
	})
	require.Len(t, pids, 5)
	for _, pid := range pids {
		assert.False(t, testenv.ProcessAlive(pid), "process %d outlived cleanup", pid)
	}
}
