package fence_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

// The footprint the package doc states: two keys while a lock is held,
// the counter alone after, with its 30-day idle expiry, and their sizes.
func TestFootprint(t *testing.T) {
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
