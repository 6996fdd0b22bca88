package fence_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// The footprint the package doc states: two keys while a lock is held,
// the counter alone after, with its 30-day idle expiry, and their sizes.
func TestFootprint(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil)
	rdb := r.Client()
	name := "order:2026-000123456"
	l, err := c.Acquire(ctx, name)
	require.NoError(t, err)
	keys, err := rdb.Keys(ctx, r.Prefix+"*").Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{lockKey(r, name), lockKey(r, name) + ":seq"}, keys, "keys while held")
	lockBytes, err := rdb.MemoryUsage(ctx, lockKey(r, name)).Result()
	require.NoError(t, err)
	seqBytes, err := rdb.MemoryUsage(ctx, lockKey(r, name)+":seq").Result()
	require.NoError(t, err)
	t.Logf("MEMORY USAGE: lock %d B, counter %d B (key tables and expiry entries not included)", lockBytes, seqBytes)
	assert.LessOrEqual(t, lockBytes, int64(200))
	assert.LessOrEqual(t, seqBytes, int64(150))

	require.NoError(t, l.Release(ctx))
	keys, err = rdb.Keys(ctx, r.Prefix+"*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{lockKey(r, name) + ":seq"}, keys, "after release, the counter alone")
	ttl, err := rdb.PTTL(ctx, lockKey(r, name)+":seq").Result()
	require.NoError(t, err)
	assert.InDelta(t, float64(30*24*time.Hour), float64(ttl), float64(time.Minute), "the counter's idle expiry")
}

// A waiter's place costs a list entry and a hash field: under 200 bytes
// each with default holder ids, measured with more waiters than the
// compact encodings hold (Redis turns the hash into a table beyond 128
// fields), on this host and on one whose name is as long as a host name
// may be (63 characters, as pod names run); both keys go when the queue
// empties.
func TestQueueFootprint(t *testing.T) {
	t.Run("this host", func(t *testing.T) { testQueueFootprint(t) })
	t.Run("63-character host", func(t *testing.T) {
		restore := fence.SetHost("inventory-sync-worker-deployment-7c9d8f6b5d-x2x9z-canary-euw1-b")
		t.Cleanup(restore)
		testQueueFootprint(t)
	})
}

func testQueueFootprint(t *testing.T) {
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 60*time.Second)
	holder := newClient(t, r, nil)
	waiters := newClient(t, r, r.NewClient(&redis.Options{PoolSize: 32}))
	held, err := holder.Acquire(ctx, "fp")
	require.NoError(t, err)
	const n = 300
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := waiters.Acquire(wctx, "fp")
			assert.ErrorIs(t, err, fence.ErrNotAcquired)
		}()
	}
	waitQueued(t, r, "fp", n)
	list, hash := queueKeys(r, "fp")
	ids, err := r.Client().LRange(ctx, list, 0, 0).Result()
	require.NoError(t, err)
	require.Len(t, ids, 1)
	t.Logf("a default holder id: %q (%d bytes)", ids[0], len(ids[0]))
	lb, err := r.Client().MemoryUsage(ctx, list).Result()
	require.NoError(t, err)
	hb, err := r.Client().MemoryUsage(ctx, hash).Result()
	require.NoError(t, err)
	per := float64(lb+hb) / n
	t.Logf("MEMORY USAGE with %d waiters: queue %d B, waiters %d B: %.0f B per waiter", n, lb, hb, per)
	assert.Less(t, per, 200.0)
	cancel()
	wg.Wait()
	require.NoError(t, held.Release(ctx))
	require.Eventually(t, func() bool {
		k, err := r.Client().Exists(ctx, list, hash).Result()
		return err == nil && k == 0
	}, 10*time.Second, 10*time.Millisecond, "the queue's keys outlive its waiters")
}
