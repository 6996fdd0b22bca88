package fence_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// counts counts loss and release events without keeping them.
type counts struct{ lost, released atomic.Int64 }

func (c *counts) OnLoss(context.Context, fence.LossEvent)       { c.lost.Add(1) }
func (c *counts) OnRelease(context.Context, fence.ReleaseEvent) { c.released.Add(1) }

func heapAfterGC() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// The "obtain and let it expire" pattern: fixed-lease locks never
// released. The client forgets each at its deadline, so its memory comes
// back to where it was, and Close releases only the lock still valid.
func TestLetExpireLocksAreForgotten(t *testing.T) {
	// Not parallel: it reads the process's heap.
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 120*time.Second)
	ev := &counts{}
	c := newClient(t, r, nil, fence.WithObserver(ev))
	// Warm up (connection pool, script cache, watchdog heap) before the
	// baseline.
	for i := range 100 {
		_, err := c.TryAcquire(ctx, "warm"+itoa(i), fence.WithFixedLease(fence.MinLease))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return ev.lost.Load() == 100 }, 30*time.Second, 5*time.Millisecond)
	base := heapAfterGC()

	const n = 10000
	for i := range n {
		_, err := c.TryAcquire(ctx, "exp"+itoa(i), fence.WithFixedLease(fence.MinLease))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return ev.lost.Load() == 100+n }, 60*time.Second, 5*time.Millisecond,
		"every lock reached its deadline")
	after := heapAfterGC()
	t.Logf("heap: %d B before, %d B after %d expired locks (%+d B)", base, after, n, after-base)
	// A lock kept costs ~700 B: 10,000 of them would be ~7 MB, and the
	// last batch of losses the watchdog signalled at once (hundreds under
	// load) a few hundred KB. What is left is the grown watchdog heap and
	// lock map: under 100 KB.
	assert.Less(t, after-base, int64(256<<10), "the client keeps expired locks")

	valid, err := c.TryAcquire(ctx, "valid", fence.WithFixedLease(time.Minute))
	require.NoError(t, err)
	require.NoError(t, c.Close(ctx))
	assert.EqualValues(t, 1, ev.released.Load(), "Close released the one valid lock and no expired one")
	assert.ErrorIs(t, valid.Err(), fence.ErrClosed)
	n2, err := r.Client().Exists(ctx, lockKey(r, "valid")).Result()
	require.NoError(t, err)
	assert.Zero(t, n2)
}
