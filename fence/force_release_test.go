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

// An operator breaks a stuck holder's lock with ForceRelease: a waiter of
// another client gets it on the release message, long before the 30 s
// lease or its retry; the holder learns at its next renewal (its context
// ends with ErrLockLost) and its Release says it no longer holds it. A
// LockInfo that is out of date (the lock was taken again since) deletes
// nothing. On a single Redis (PUBLISH) and on a cluster (SPUBLISH).
func TestForceRelease(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		r := testenv.NewRedis(t)
		forceRelease(t, r, r.Client())
	})
	t.Run("cluster", func(t *testing.T) {
		r := testenv.NewRedisServer(t, testenv.WithRedisArgs("--cluster-enabled", "yes"))
		ctx := ctxT(t, 30*time.Second)
		require.NoError(t, r.Client().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err())
		require.Eventually(t, func() bool {
			info, err := r.Client().ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		}, 10*time.Second, 50*time.Millisecond)
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{r.Addr}})
		t.Cleanup(func() { _ = cc.Close() })
		forceRelease(t, r, cc)
	})
}

func forceRelease(t *testing.T, r *testenv.Redis, rdb fence.RedisClient) {
	ctx := ctxT(t, 30*time.Second)
	holder := newClient(t, r, rdb)
	waiter := newClient(t, r, rdb)
	operator := newClient(t, r, rdb)

	// The holder renews every second: its loss shows within a period.
	stuck, err := holder.Acquire(ctx, "job", fence.WithLease(3*time.Second))
	require.NoError(t, err)
	got := make(chan *fence.Lock, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "job", fence.WithWaitLimit(20*time.Second))
		assert.NoError(t, err)
		got <- l
	}()
	// The waiter subscribed (sharded pub/sub on a cluster).
	ch := lockKey(r, "job") + ":ch"
	require.Eventually(t, func() bool {
		n, err := r.Client().PubSubNumSub(ctx, ch).Result()
		if err == nil && n[ch] > 0 {
			return true
		}
		sn, err := r.Client().PubSubShardNumSub(ctx, ch).Result()
		return err == nil && sn[ch] > 0
	}, 10*time.Second, 5*time.Millisecond, "the waiter subscribed")

	seen, err := operator.Inspect(ctx, "job")
	require.NoError(t, err)
	require.True(t, seen.Held)
	start := time.Now()
	woken, err := operator.ForceRelease(ctx, seen)
	require.NoError(t, err)
	assert.True(t, woken, "the release message went out")
	var next *fence.Lock
	select {
	case next = <-got:
	case <-ctx.Done():
		t.Fatal("the waiter did not get the lock")
	}
	t.Logf("waiter holds the lock %v after the forced release", time.Since(start))
	assert.Less(t, time.Since(start), 2*time.Second, "woken by the message, not by a retry")
	assert.Greater(t, next.Token(), stuck.Token())

	select {
	case <-stuck.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the stuck holder did not learn of the loss within a renewal period")
	}
	assert.ErrorIs(t, context.Cause(stuck.Context()), fence.ErrLockLost)
	assert.ErrorIs(t, stuck.Release(ctx), fence.ErrNotHeld)

	// The LockInfo of the stuck holder is out of date now: the lock is
	// the waiter's, and it stays.
	_, err = operator.ForceRelease(ctx, seen)
	require.ErrorIs(t, err, fence.ErrNotHeld)
	assert.Contains(t, err.Error(), "changed since it was inspected")
	now, err := operator.Inspect(ctx, "job")
	require.NoError(t, err)
	assert.True(t, now.Held)
	assert.Equal(t, next.Token(), now.Token)
	require.NoError(t, next.Err())

	// Bad input says what is wrong and deletes nothing.
	_, err = operator.ForceRelease(ctx, fence.LockInfo{Name: "job"})
	assert.ErrorIs(t, err, fence.ErrNotHeld, "not held when inspected")
	_, err = operator.ForceRelease(ctx, fence.LockInfo{Name: "job", Held: true})
	assert.ErrorIs(t, err, fence.ErrInvalidOption)
	_, err = operator.ForceRelease(ctx, fence.LockInfo{Name: "", Held: true, Token: 1, Holder: "x"})
	assert.ErrorIs(t, err, fence.ErrInvalidName)
	require.NoError(t, next.Release(ctx))
	require.NoError(t, operator.Close(ctx))
	_, err = operator.ForceRelease(ctx, now)
	assert.ErrorIs(t, err, fence.ErrClosed)
}
