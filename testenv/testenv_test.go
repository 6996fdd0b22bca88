package testenv_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(envLockPort) != "" {
		portLocker()
		return
	}
	testenv.Main(m)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestRedisAnswers(t *testing.T) {
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 5*time.Second)
	c := r.Client()
	require.NoError(t, c.Set(ctx, r.Prefix+"k", "v", 0).Err())
	got, err := c.Get(ctx, r.Prefix+"k").Result()
	require.NoError(t, err)
	assert.Equal(t, "v", got)
}

func TestRedisPauseResume(t *testing.T) {
	r := testenv.NewRedisServer(t)
	c := r.NewClient(&redis.Options{ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, c.Ping(ctx).Err())

	require.NoError(t, r.Pause())
	start := time.Now()
	err := c.Ping(ctx).Err()
	require.Error(t, err, "a paused server must not answer")
	var ne net.Error
	assert.True(t, errors.As(err, &ne) && ne.Timeout(), "want a timeout, got %v", err)
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)

	require.NoError(t, r.Resume())
	require.Eventually(t, func() bool { return c.Ping(ctx).Err() == nil }, 5*time.Second, 20*time.Millisecond)
}

func TestRedisRestartKeepData(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []testenv.RedisOption
	}{{"save", nil}, {"aof", []testenv.RedisOption{testenv.WithAOF()}}} {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.NewRedisServer(t, tc.opts...)
			ctx := ctxT(t, 20*time.Second)
			pid := r.PID()
			require.NoError(t, r.Client().Set(ctx, "k", "v", 0).Err())
			require.NoError(t, r.Restart(true))
			assert.NotEqual(t, pid, r.PID(), "restart must start a new process")
			assert.False(t, testenv.ProcessAlive(pid), "old server process still alive")
			c := r.NewClient(nil)
			got, err := c.Get(ctx, "k").Result()
			require.NoError(t, err)
			assert.Equal(t, "v", got)

			require.NoError(t, r.Restart(false))
			c = r.NewClient(nil)
			_, err = c.Get(ctx, "k").Result()
			assert.ErrorIs(t, err, redis.Nil, "restart without data must lose the key")
		})
	}
}

func TestRedisFlushAndKill(t *testing.T) {
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 10*time.Second)
	c := r.Client()
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	require.NoError(t, r.Flush(ctx))
	n, err := c.DBSize(ctx).Result()
	require.NoError(t, err)
	assert.Zero(t, n)

	pid := r.PID()
	require.NoError(t, r.Kill())
	assert.False(t, testenv.ProcessAlive(pid))
	assert.Error(t, r.NewClient(&redis.Options{MaxRetries: -1, DialTimeout: 200 * time.Millisecond}).Ping(ctx).Err())
	require.NoError(t, r.Restart(false))
	assert.NoError(t, r.NewClient(nil).Ping(ctx).Err())
}

func TestNoServerLeftAfterCleanup(t *testing.T) {
	var redisPID, pgPID int
	t.Run("inner", func(t *testing.T) {
		r := testenv.NewRedisServer(t)
		redisPID = r.PID()
		require.NoError(t, r.Pause()) // a paused server must be stopped too
		pg, err := testenv.StartPostgres()
		require.NoError(t, err)
		t.Cleanup(func() { _ = pg.Stop() })
		pgPID = pg.PID()
		db := pg.NewDB(t)
		require.NoError(t, db.Pool.Ping(ctxT(t, 10*time.Second)))
	})
	require.NotZero(t, redisPID)
	require.NotZero(t, pgPID)
	assert.False(t, testenv.ProcessAlive(redisPID), "redis-server %d outlived cleanup", redisPID)
	assert.False(t, testenv.ProcessAlive(pgPID), "postgres %d outlived cleanup", pgPID)
}

func TestPostgresDBAndRestart(t *testing.T) {
	pg, err := testenv.StartPostgres()
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })
	db := pg.NewDB(t)
	ctx := ctxT(t, 60*time.Second)
	_, err = db.Pool.Exec(ctx, "CREATE TABLE t (v int); INSERT INTO t VALUES (42)")
	require.NoError(t, err)

	require.NoError(t, pg.Restart())
	var v int
	require.Eventually(t, func() bool {
		return db.Pool.QueryRow(ctx, "SELECT v FROM t").Scan(&v) == nil
	}, 20*time.Second, 50*time.Millisecond, "pool must reconnect after restart")
	assert.Equal(t, 42, v, "data must survive a restart")

	// A second database on the shared server is separate.
	other := testenv.NewDB(t)
	assert.NotEqual(t, db.Name, other.Name)
}

// echo server for proxy tests
func startEcho(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func TestProxyFaults(t *testing.T) {
	echo := startEcho(t)
	p, err := testenv.NewProxy(echo)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	c, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c.Close()
	got, err := roundTrip(c, "hello", time.Second)
	require.NoError(t, err)
	require.Equal(t, "hello", got)

	t.Run("delay", func(t *testing.T) {
		p.Delay(100 * time.Millisecond)
		start := time.Now()
		got, err := roundTrip(c, "slow", 5*time.Second)
		require.NoError(t, err)
		assert.Equal(t, "slow", got)
		// 100 ms each way: at least 200 ms.
		assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
		p.Restore()
	})

	t.Run("blackhole", func(t *testing.T) {
		p.Blackhole()
		_, err := roundTrip(c, "lost?", 300*time.Millisecond)
		var ne net.Error
		require.True(t, errors.As(err, &ne) && ne.Timeout(), "blackholed link must time out, got %v", err)
		// New connections are accepted but get no answer either.
		c2, err := net.Dial("tcp", p.Addr)
		require.NoError(t, err)
		defer c2.Close()
		_, err = roundTrip(c2, "x", 200*time.Millisecond)
		require.Error(t, err)
		// After Restore the held data arrives, like TCP after a partition.
		p.Restore()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 5)
		_, err = io.ReadFull(c, buf)
		require.NoError(t, err)
		assert.Equal(t, "lost?", string(buf))
	})

	t.Run("drop", func(t *testing.T) {
		before := p.Reads()
		p.Drop()
		_, err := roundTrip(c, "gone", 300*time.Millisecond)
		var ne net.Error
		require.True(t, errors.As(err, &ne) && ne.Timeout(), "a dropped request must time out, got %v", err)
		require.Eventually(t, func() bool { return p.Reads() > before }, time.Second, time.Millisecond, "the request reached the proxy")
		p.Restore()
		// Unlike a blackhole, nothing arrives after Restore: the echo of
		// the next request is the first thing read, and the connection
		// stayed open.
		got, err := roundTrip(c, "after", 2*time.Second)
		require.NoError(t, err)
		assert.Equal(t, "after", got)
	})

	t.Run("cut", func(t *testing.T) {
		p.Cut()
		_, err := roundTrip(c, "dead", time.Second)
		require.Error(t, err, "a cut connection must fail")
		var cutErr net.Error
		assert.False(t, errors.As(err, &cutErr) && cutErr.Timeout(), "a cut must fail at once, not time out: %v", err)
		c3, err := net.Dial("tcp", p.Addr)
		if err == nil {
			_, err = roundTrip(c3, "x", time.Second)
			c3.Close()
		}
		require.Error(t, err, "new connections must be refused while cut")
		var ne net.Error
		assert.False(t, errors.As(err, &ne) && ne.Timeout(), "refusal must be immediate, not a timeout: %v", err)
		p.Restore()
		c4, err := net.Dial("tcp", p.Addr)
		require.NoError(t, err)
		defer c4.Close()
		got, err := roundTrip(c4, "back", time.Second)
		require.NoError(t, err)
		assert.Equal(t, "back", got)
	})
}

func TestProxyWithRedis(t *testing.T) {
	r := testenv.NewRedisServer(t)
	p, err := testenv.NewProxy(r.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, c.Ping(ctx).Err())
	p.Blackhole()
	require.Error(t, c.Ping(ctx).Err())
	p.Restore()
	require.Eventually(t, func() bool { return c.Ping(ctx).Err() == nil }, 3*time.Second, 20*time.Millisecond)
}

func TestExternalFaultsRefused(t *testing.T) {
	t.Setenv(testenv.EnvRedisURL, "redis://127.0.0.1:1")
	r := testenv.NewRedis(t)
	assert.True(t, r.External())
	assert.ErrorIs(t, r.Pause(), testenv.ErrExternal)
	assert.ErrorIs(t, r.Restart(false), testenv.ErrExternal)
}
