package fence

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

// A heartbeat ('b') of a waiter that has no place in the queue — it left,
// and the heartbeat sent before its leave arrives after it — never takes
// the lock, even a free one with nobody queued: that lock would be held
// for a lease by no one. Its first call ('w') does take a free lock.
func TestStaleHeartbeatTakesNothing(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(r.Client(), WithPrefix(r.Prefix+"fence:"))
	require.NoError(t, err)
	defer c.Close(ctx)
	k := keysFor(c.cfg.prefix, "stale")
	call := func(m mode) acquireReply {
		t.Helper()
		v, err := c.scripts.acquire.Run(ctx, c.rdb, k.scriptKeys(), acquireArgs(&c.cfg, "gone", m)...).Result()
		require.NoError(t, err)
		rep, err := parseAcquire(v)
		require.NoError(t, err)
		return rep
	}
	rep := call(modeBeat)
	assert.False(t, rep.acquired, "a heartbeat without a place took the lock")
	assert.False(t, rep.queued, "a heartbeat does not queue")
	n, err := r.Client().Exists(ctx, k.lock, k.queue, k.waiters).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing written")

	rep = call(modeWait)
	assert.True(t, rep.acquired, "a first call takes a free lock")
}
