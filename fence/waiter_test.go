package fence_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// The shared pub/sub connection is killed while a waiter waits: it is
// redialled and resubscribed, and the release message still wakes the
// waiter long before the holder's 30 s lease would.
func TestWaiterSurvivesPubSubReconnect(t *testing.T) {
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 30*time.Second)
	holder := newClient(t, r, nil)
	waiters := newClient(t, r, r.NewClient(&redis.Options{ClientName: "waiter"}))
	held, err := holder.Acquire(ctx, "rc")
	require.NoError(t, err)
	got := make(chan *fence.Lock, 1)
	go func() {
		l, err := waiters.Acquire(ctx, "rc")
		assert.NoError(t, err)
		got <- l
	}()
	time.Sleep(200 * time.Millisecond)
	killed, err := r.Client().ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, killed)
	// Wait until the waiter's connection is back and subscribed.
	require.Eventually(t, func() bool {
		n, err := r.Client().PubSubNumSub(ctx, lockKey(r, "rc")+":ch").Result()
		return err == nil && n[lockKey(r, "rc")+":ch"] == 1
	}, 10*time.Second, 20*time.Millisecond)
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	select {
	case l := <-got:
		require.NotNil(t, l)
		assert.Less(t, time.Since(released), 10*time.Second)
		require.NoError(t, l.Release(ctx))
	case <-ctx.Done():
		t.Fatal("waiter not woken after the pub/sub reconnect")
	}
}
