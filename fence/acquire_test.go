package fence_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// closedPort is a loopback address nothing listens on: connections to it
// are refused.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// An outage is not contention: Acquire against a Redis that refuses
// connections waits through the refusals until its wait limit, then says
// so with the last error joined (errors.Is the dial error), and ends
// within the limit plus one attempt bounded by the wait's own deadline,
// however long ctx would have allowed. It pins both a stopped server and
// a port nothing ever listened on.
func TestAcquireOutageCarriesLastError(t *testing.T) {
	stopped := testenv.NewRedisServer(t)
	addrs := map[string]string{"stopped server": stopped.Addr, "closed port": closedPort(t)}
	require.NoError(t, stopped.Stop())
	for what, addr := range addrs {
		t.Run(what, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { _ = rdb.Close() })
			c, err := fence.New(rdb)
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close(context.Background()) })

			const limit = time.Second
			ctx := ctxT(t, 30*time.Second)
			start := time.Now()
			l, err := c.Acquire(ctx, "outage", fence.WithWaitLimit(limit))
			took := time.Since(start)
			require.Nil(t, l)
			t.Logf("%v: %v", took, err)
			assert.ErrorIs(t, err, fence.ErrNotAcquired)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.ErrorIs(t, err, syscall.ECONNREFUSED, "the last transient error is joined")
			assert.Contains(t, err.Error(), "wait limit 1s reached")
			assert.Contains(t, err.Error(), "connection refused")
			assert.GreaterOrEqual(t, took, limit)
			// The limit plus one attempt cut at the wait's deadline, with
			// room for a loaded machine; ctx allowed 30 s.
			assert.Less(t, took, limit+time.Second, "the wait outlived its limit")

			// TryAcquire says the same cause, once.
			_, err = c.TryAcquire(ctx, "outage")
			assert.ErrorIs(t, err, syscall.ECONNREFUSED)
			assert.False(t, errors.Is(err, fence.ErrNotAcquired), "an outage is not contention: %v", err)
		})
	}
}

// Do names a loss once: an error of fn that wraps the loss (as
// guard.Exec's does) is returned alone, and Release's "not held" for the
// lost lock is not added to it.
func TestDoNamesTheLossOnce(t *testing.T) {
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	c := newClient(t, r, nil)
	err := c.Do(ctx, "once", func(ctx context.Context, l *fence.Lock) error {
		require.NoError(t, r.Client().Del(ctx, lockKey(r, "once")).Err())
		<-ctx.Done()
		return fmt.Errorf("sync step 3: %w", context.Cause(ctx))
	}, fence.WithLease(300*time.Millisecond))
	t.Log(err)
	require.ErrorIs(t, err, fence.ErrLockLost)
	assert.Equal(t, 1, strings.Count(err.Error(), "lock lost"), "the loss once: %v", err)
	assert.NotContains(t, err.Error(), "not held")
	assert.True(t, strings.HasPrefix(err.Error(), `sync step 3: fence: lock lost: "once" token `), "%v", err)
}
