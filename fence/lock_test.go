package fence_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// A nil *Lock (what a failed Acquire returns) answers every method
// without panicking.
func TestNilLock(t *testing.T) {
	var l *fence.Lock
	ctx := context.Background()
	assert.NotPanics(t, func() {
		assert.Empty(t, l.Name())
		assert.Zero(t, l.Token())
		assert.Empty(t, l.Holder())
		assert.True(t, l.Deadline().IsZero())
		assert.Equal(t, "fence.Lock(nil)", l.String())
		assert.ErrorIs(t, l.Err(), fence.ErrNotHeld)
		assert.ErrorIs(t, l.Release(ctx), fence.ErrNotHeld)
		assert.ErrorIs(t, l.Refresh(ctx, time.Second), fence.ErrNotHeld)
		assert.ErrorIs(t, context.Cause(l.Context()), fence.ErrNotHeld)
		select {
		case <-l.Done():
		default:
			t.Error("Done of a nil lock is not closed")
		}
	})
}

// A done ctx ends TryAcquire and Acquire with an error that matches both
// ErrNotAcquired and the ctx's error, whether the lock is free or held.
func TestDoneContextNotAcquired(t *testing.T) {
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel2()
	check := func(what string) {
		t.Helper()
		for _, tc := range []struct {
			ctx  context.Context
			want error
		}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
			l, err := c.TryAcquire(tc.ctx, "done")
			assert.Nil(t, l)
			assert.ErrorIs(t, err, fence.ErrNotAcquired, "TryAcquire, %s", what)
			assert.ErrorIs(t, err, tc.want, "TryAcquire, %s", what)
			l, err = c.Acquire(tc.ctx, "done")
			assert.Nil(t, l)
			assert.ErrorIs(t, err, fence.ErrNotAcquired, "Acquire, %s", what)
			assert.ErrorIs(t, err, tc.want, "Acquire, %s", what)
		}
	}
	check("lock free")
	held, err := c.Acquire(ctx, "done")
	require.NoError(t, err)
	check("lock held")
	require.NoError(t, held.Release(ctx))
	n, err := r.Client().Exists(ctx, lockKey(r, "done")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a done ctx acquired nothing")
}

// Release after the lock was lost locally reports the loss, even while
// the key is still on the server (here kept alive by hand while the
// client's renewals cannot reach it).
func TestReleaseAfterLocalLossReportsIt(t *testing.T) {
	r := testenv.NewRedisServer(t)
	p, err := testenv.NewProxy(r.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := ctxT(t, 30*time.Second)
	c := newClient(t, r, rdb, fence.WithLease(time.Second))
	l, err := c.Acquire(ctx, "rl")
	require.NoError(t, err)
	require.NoError(t, r.Client().PExpire(ctx, lockKey(r, "rl"), time.Minute).Err())
	p.Blackhole()
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("not lost while renewals could not reach the server")
	}
	p.Restore()
	n, err := r.Client().Exists(ctx, lockKey(r, "rl")).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the key is still on the server")
	err = l.Release(ctx)
	assert.ErrorIs(t, err, fence.ErrNotHeld)
	assert.ErrorIs(t, err, fence.ErrLockLost)
	var lost *fence.LostError
	require.ErrorAs(t, err, &lost)
	assert.Equal(t, fence.ReasonDeadline, lost.Reason)

	// Max hold: the key is still ours until its lease ends; Release
	// frees it and reports why the lock had ended.
	m, err := c.Acquire(ctx, "mh", fence.WithLease(10*time.Second), fence.WithMaxHold(200*time.Millisecond))
	require.NoError(t, err)
	<-m.Done()
	err = m.Release(ctx)
	assert.ErrorIs(t, err, fence.ErrNotHeld)
	assert.ErrorIs(t, err, fence.ErrMaxHold)
	n, err = r.Client().Exists(ctx, lockKey(r, "mh")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "released after max hold")
}
