package fence_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

func TestInspect(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil)

	info, err := c.Inspect(ctx, "ins")
	require.NoError(t, err)
	assert.False(t, info.Eviction.Evicts(), "the test server evicts nothing: %+v", info.Eviction)
	info.Eviction = fence.Eviction{}
	assert.Equal(t, fence.LockInfo{Name: "ins"}, info, "never used")

	l, err := c.Acquire(ctx, "ins")
	require.NoError(t, err)
	info, err = c.Inspect(ctx, "ins")
	require.NoError(t, err)
	assert.True(t, info.Held)
	assert.Equal(t, l.Holder(), info.Holder)
	assert.Equal(t, l.Token(), info.Token)
	assert.Equal(t, l.Token(), info.Counter)
	assert.Greater(t, info.TTL, fence.DefaultLease/2, "about a default lease")
	assert.Zero(t, info.Waiters)
	got := acquireAsync(ctx, c, "ins")
	waitQueued(t, r, "ins", 1)
	info, err = c.Inspect(ctx, "ins")
	require.NoError(t, err)
	assert.EqualValues(t, 1, info.Waiters, "one waiter queues")
	require.NoError(t, l.Release(ctx))
	a := <-got
	require.NoError(t, a.err)
	l = a.l
	require.NoError(t, l.Release(ctx))

	info, err = c.Inspect(ctx, "ins")
	require.NoError(t, err)
	assert.False(t, info.Held)
	assert.Equal(t, l.Token(), info.Counter)

	_, err = c.Inspect(ctx, "a{b}")
	assert.ErrorIs(t, err, fence.ErrInvalidName)
}

func TestRaiseCounter(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil)
	l, err := c.TryAcquire(ctx, "rc")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))

	// Never lowers.
	got, err := c.RaiseCounter(ctx, "rc", 1)
	require.NoError(t, err)
	assert.Equal(t, l.Token(), got)

	// A database high-water mark far above the clock-based tokens.
	hw := l.Token() + 5_000_000_000
	got, err = c.RaiseCounter(ctx, "rc", hw)
	require.NoError(t, err)
	assert.Equal(t, hw, got)
	l2, err := c.TryAcquire(ctx, "rc")
	require.NoError(t, err)
	assert.Equal(t, hw+1, l2.Token())
	require.NoError(t, l2.Release(ctx))

	_, err = c.RaiseCounter(ctx, "rc", -1)
	assert.ErrorIs(t, err, fence.ErrInvalidOption)
	_, err = c.RaiseCounter(ctx, "", 5)
	assert.ErrorIs(t, err, fence.ErrInvalidName)
}

// The lock's value is '<token>:<holder>': a holder id containing ':' reads
// back whole, and its release and renewal still match it exactly.
func TestHolderWithColon(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil)
	l, err := c.Acquire(ctx, "colon", fence.WithHolder("host:1234:worker"), fence.WithFixedLease(time.Second))
	require.NoError(t, err)
	info, err := c.Inspect(ctx, "colon")
	require.NoError(t, err)
	assert.Equal(t, "host:1234:worker", info.Holder)
	assert.Equal(t, l.Token(), info.Token)
	require.NoError(t, l.Refresh(ctx, 10*time.Second))
	require.NoError(t, l.Release(ctx))

	// A value written by hand in another layout is reported, not misread.
	require.NoError(t, r.Client().Set(ctx, lockKey(r, "colon"), "garbage", time.Minute).Err())
	_, err = c.Inspect(ctx, "colon")
	assert.ErrorContains(t, err, "not <token>:<holder>")
}
