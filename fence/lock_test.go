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

// A nil *Lock (what a failed Acquire returns) answers every method
// without panicking.
func TestNilLock(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
	r := testenv.NewRedisServer(t)
	p, rdb := proxied(t, r.Addr, redis.Options{ContextTimeoutEnabled: true})
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
	assert.Equal(t, 1, strings.Count(err.Error(), "fence:"), "one prefix: %v", err)
	assert.Contains(t, err.Error(), `"rl" token `)
	assert.Contains(t, err.Error(), "ended before Release: lock lost: no renewal succeeded before the local deadline")

	// Max hold: the key is still ours until its lease ends; Release
	// frees it and reports why the lock had ended.
	m, err := c.Acquire(ctx, "mh", fence.WithLease(10*time.Second), fence.WithMaxHold(200*time.Millisecond))
	require.NoError(t, err)
	<-m.Done()
	err = m.Release(ctx)
	assert.ErrorIs(t, err, fence.ErrNotHeld)
	assert.ErrorIs(t, err, fence.ErrMaxHold)
	assert.Equal(t, 1, strings.Count(err.Error(), "fence:"), "one prefix: %v", err)
	assert.Contains(t, err.Error(), "ended before Release: max hold time reached")
	n, err = r.Client().Exists(ctx, lockKey(r, "mh")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "released after max hold")
}

// A lock that ended is refused by Refresh with its own error, whether the
// watchdog renewed it or it had a fixed lease: the error matches
// ErrNotHeld and what Err says (released, lost, closed), never "invalid
// option", and names the cause once.
func TestRefreshEndedLock(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	for _, kind := range []struct {
		name string
		opts []fence.LockOption
	}{{"watchdog", nil}, {"fixed", []fence.LockOption{fence.WithFixedLease(10 * time.Second)}}} {
		t.Run(kind.name, func(t *testing.T) {
			c := newClient(t, r, nil, fence.WithLease(time.Second))
			check := func(l *fence.Lock, want error) {
				t.Helper()
				err := l.Refresh(ctx, time.Second)
				require.Error(t, err)
				assert.ErrorIs(t, err, fence.ErrNotHeld)
				assert.ErrorIs(t, err, want)
				assert.ErrorIs(t, err, l.Err(), "the lock's own error")
				assert.NotErrorIs(t, err, fence.ErrInvalidOption)
				assert.Equal(t, 1, strings.Count(err.Error(), "fence:"), "one prefix: %v", err)
				t.Log(err)
			}

			released, err := c.Acquire(ctx, kind.name+"-released", kind.opts...)
			require.NoError(t, err)
			require.NoError(t, released.Release(ctx))
			check(released, fence.ErrReleased)

			lost, err := c.Acquire(ctx, kind.name+"-lost", kind.opts...)
			require.NoError(t, err)
			require.NoError(t, r.Client().Set(ctx, lockKey(r, kind.name+"-lost"), "1:someone-else", time.Minute).Err())
			if kind.opts == nil {
				select { // the watchdog's next renewal finds it taken
				case <-lost.Done():
				case <-ctx.Done():
					t.Fatal("the watchdog did not find the lock taken")
				}
			} else { // the first Refresh finds it taken, the next one knows
				err := lost.Refresh(ctx, time.Second)
				assert.ErrorIs(t, err, fence.ErrNotHeld)
				assert.ErrorContains(t, err, `holder "someone-else" has it with token 1`)
			}
			check(lost, fence.ErrLockLost)

			other := newClient(t, r, nil)
			closed, err := other.Acquire(ctx, kind.name+"-closed", kind.opts...)
			require.NoError(t, err)
			require.NoError(t, other.Close(ctx))
			assert.ErrorIs(t, closed.Refresh(ctx, time.Second), fence.ErrClosed)
			assert.ErrorIs(t, closed.Err(), fence.ErrClosed)
		})
	}
}

type traceKey struct{}

// A lock's context is made by the first call that asks for it, and a
// lock that ended before then hands out a context already cancelled with
// why it ended: released, lost at its deadline, or closed. It carries
// the acquiring call's values either way, and never its cancellation.
func TestContextAfterEnd(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := context.WithValue(ctxT(t, 30*time.Second), traceKey{}, "trace-1")
	c := newClient(t, r, nil)
	ended := func(t *testing.T, l *fence.Lock, want error) {
		t.Helper()
		lctx := l.Context()
		select {
		case <-lctx.Done():
		default:
			t.Fatal("the context of an ended lock is not done")
		}
		assert.ErrorIs(t, context.Cause(lctx), want)
		assert.ErrorIs(t, l.Err(), want)
		assert.Equal(t, "trace-1", lctx.Value(traceKey{}), "the acquiring call's values")
		assert.Same(t, lctx, l.Context(), "one context per lock")
	}

	t.Run("released", func(t *testing.T) {
		l, err := c.Acquire(ctx, "released")
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		ended(t, l, fence.ErrReleased)
	})
	t.Run("lost", func(t *testing.T) {
		l, err := c.Acquire(ctx, "lost", fence.WithFixedLease(fence.MinLease))
		require.NoError(t, err)
		// The watchdog ends it at its deadline; nobody made its context.
		require.Eventually(t, func() bool { return l.Err() != nil }, 10*time.Second, 5*time.Millisecond)
		ended(t, l, fence.ErrLockLost)
		var lost *fence.LostError
		require.ErrorAs(t, l.Err(), &lost)
		assert.Equal(t, fence.ReasonLeaseEnded, lost.Reason)
	})
	t.Run("closed", func(t *testing.T) {
		c2 := newClient(t, r, nil)
		l, err := c2.Acquire(ctx, "closed")
		require.NoError(t, err)
		require.NoError(t, c2.Close(ctx))
		ended(t, l, fence.ErrClosed)
	})
	t.Run("made while held", func(t *testing.T) {
		acq, cancel := context.WithCancel(ctx)
		l, err := c.Acquire(acq, "held")
		require.NoError(t, err)
		lctx := l.Context()
		cancel()
		assert.NoError(t, lctx.Err(), "the acquiring call's cancellation does not end the lock")
		require.NoError(t, l.Release(ctx))
		<-lctx.Done()
		assert.ErrorIs(t, context.Cause(lctx), fence.ErrReleased)
	})
}
