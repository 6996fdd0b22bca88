package fence_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// An outage is not contention: Acquire against a Redis that refuses
// connections waits through the refusals until its wait limit, then says
// so with the last error joined (errors.Is the dial error), and ends
// within the limit plus one attempt bounded by the wait's own deadline,
// however long ctx would have allowed. It pins both a stopped server and
// a port nothing ever listened on, and both ways a wait limit is given:
// as a lock option beside a ctx deadline, and as the client's own with a
// ctx that has none (the first attempt then takes its end from the
// client's shared bound). Both addresses stay refused while the test runs:
// testenv keeps a server's port, and RefusedAddr's, from every other
// listener.
func TestAcquireOutageCarriesLastError(t *testing.T) {
	t.Parallel()
	stopped := testenv.NewRedisServer(t)
	addrs := map[string]string{"stopped server": stopped.Addr, "closed port": testenv.RefusedAddr(t)}
	require.NoError(t, stopped.Stop())
	const limit = time.Second
	ways := map[string]struct {
		client []fence.ClientOption
		lock   []fence.LockOption
		ctx    func(t *testing.T) context.Context
	}{
		"lock option": {lock: []fence.LockOption{fence.WithWaitLimit(limit)},
			ctx: func(t *testing.T) context.Context { return ctxT(t, 30*time.Second) }},
		"client option": {client: []fence.ClientOption{fence.WithWaitLimit(limit)},
			ctx: func(*testing.T) context.Context { return context.Background() }},
	}
	for what, addr := range addrs {
		for way, w := range ways {
			t.Run(what+"/"+way, func(t *testing.T) {
				t.Parallel()
				rdb := redis.NewClient(&redis.Options{Addr: addr})
				t.Cleanup(func() { _ = rdb.Close() })
				c, err := fence.New(rdb, w.client...)
				require.NoError(t, err)
				t.Cleanup(func() { _ = c.Close(context.Background()) })

				ctx := w.ctx(t)
				start := time.Now()
				l, err := c.Acquire(ctx, "outage", w.lock...)
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
				// room for a loaded machine; ctx allowed 30 s or had no end.
				assert.Less(t, took, limit+time.Second, "the wait outlived its limit")

				// TryAcquire says the same cause, once.
				_, err = c.TryAcquire(ctx, "outage")
				assert.ErrorIs(t, err, syscall.ECONNREFUSED)
				assert.False(t, errors.Is(err, fence.ErrNotAcquired), "an outage is not contention: %v", err)
			})
		}
	}
}

// Do names a loss once: an error of fn that wraps the loss (as
// guard.Exec's does) is returned alone, and Release's "not held" for the
// lost lock is not added to it.
func TestDoNamesTheLossOnce(t *testing.T) {
	t.Parallel()
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

// fenceLines returns the log lines of fence (msg="fence: ...") in logs.
func fenceLines(logs string) []string {
	var out []string
	for line := range strings.Lines(logs) {
		if strings.Contains(line, `msg="fence: `) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// outageWarning begins the outage warning; what ends the wait follows.
const outageWarning = "fence: Redis is unreachable while Acquire waits; it keeps trying until "

// An outage is named while Acquire waits: with Redis killed (connections
// refused) or stopped (SIGSTOP: connections open, nothing answers), a
// waiting Acquire warns once per client that Redis is unreachable and
// what ends the wait, with the error its calls met. It is the first thing
// fence logs, and the subscription that fails with the outage is not
// reported as a pub/sub matter. (Where the warning goes without
// WithLogger: TestOutageWarningLogger.)
func TestOutageWarningNamesTheOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fault   string
		inject  func(r *testenv.Redis) error
		errText string
	}{
		{"killed", (*testenv.Redis).Kill, "connection refused"},
		{"stopped", (*testenv.Redis).Pause, "i/o timeout"},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			t.Parallel()
			r := testenv.NewRedisServer(t)
			var logs syncBuffer
			// Short timeouts: a stopped server is noticed by a read that
			// times out (go-redis's default is seconds).
			rdb := r.NewClient(&redis.Options{ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
			c := newClient(t, r, rdb, fence.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			l, err := c.TryAcquire(ctxT(t, 5*time.Second), "warm") // the client worked before the outage
			require.NoError(t, err)
			require.NoError(t, l.Release(context.Background()))
			require.NoError(t, tc.inject(r))
			t.Cleanup(func() { _ = r.Resume() })

			for range 2 { // the second wait does not warn again
				// Long enough for the subscription to give up too.
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				l, err := c.Acquire(ctx, "outage")
				cancel()
				require.Nil(t, l)
				require.ErrorIs(t, err, fence.ErrNotAcquired)
				assert.ErrorIs(t, err, context.DeadlineExceeded)
			}
			lines := fenceLines(logs.String())
			t.Logf("fence logged:\n%s", strings.Join(lines, "\n"))
			require.NotEmpty(t, lines, "nothing logged while Acquire waited through the outage")
			assert.Regexp(t, `level=WARN msg="`+regexp.QuoteMeta(outageWarning)+`its context's deadline \(in [0-9.]+m?s\) ends the wait" name=outage err=`, lines[0], "the first line names the outage and what ends the wait")
			assert.Contains(t, lines[0], tc.errText, "with the error the calls met")
			assert.Contains(t, lines[0], "addr="+r.Addr+` fix="check that redis-server runs at `+r.Addr+` and that this host may reach it"`)
			assert.Equal(t, 1, strings.Count(logs.String(), outageWarning), "once per client")
			assert.NotContains(t, logs.String(), "cannot subscribe", "the outage is not read as a pub/sub matter")
		})
	}

	// Without a deadline or WithWaitLimit, the warning names the default
	// wait limit; with WithWaitLimit, that limit.
	for _, tc := range []struct {
		name string
		opts []fence.LockOption
		want string
	}{
		{"default limit", nil, "the default wait limit, 1m0s after the call (DefaultWaitLimit; set another with WithWaitLimit or a context deadline) ends the wait"},
		{"WithWaitLimit", []fence.LockOption{fence.WithWaitLimit(42 * time.Second)}, "its wait limit, 42s after the call (WithWaitLimit) ends the wait"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := testenv.NewRedisServer(t)
			logs := newLogWatch()
			c := newClient(t, r, nil, fence.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
			require.NoError(t, r.Kill())
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { _, err := c.Acquire(ctx, "outage", tc.opts...); done <- err }()
			line := logs.waitFor(t, outageWarning)
			cancel()
			assert.ErrorIs(t, <-done, fence.ErrNotAcquired)
			assert.Contains(t, line, outageWarning+tc.want)
		})
	}
}

// TestOutageWarningLogger: without WithLogger the outage warning goes to
// slog.Default() (the operator must get it without opt-in); with
// WithLogger it goes there, and not to slog.Default(). Not parallel: it
// sets the default logger.
func TestOutageWarningLogger(t *testing.T) {
	r := testenv.NewRedisServer(t)
	var deflogs, own syncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&deflogs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	plain := newClient(t, r, nil)
	logged := newClient(t, r, nil, fence.WithLogger(slog.New(slog.NewTextHandler(&own, nil))))
	require.NoError(t, r.Kill())
	var wg sync.WaitGroup
	for _, c := range []*fence.Client{plain, logged} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Acquire(ctxT(t, 3*time.Second), "outage")
			assert.ErrorIs(t, err, fence.ErrNotAcquired)
		}()
	}
	wg.Wait()
	assert.Equal(t, 1, strings.Count(deflogs.String(), outageWarning), "the client without WithLogger, on slog.Default(): %s", deflogs.String())
	assert.Equal(t, 1, strings.Count(own.String(), outageWarning), "the client with WithLogger, on its logger: %s", own.String())
}

// A Redis user that may not SUBSCRIBE is told so, with the server's
// refusal and the ACL SETUSER line that grants it (and the Redis it waits
// on is reachable: no outage warning); its waiters still get the lock.
func TestSubscribeRefusedNamesTheCommand(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 20*time.Second)
	require.NoError(t, r.Client().Do(ctx, "ACL", "SETUSER", "nosub", "on", ">pw", "~*", "&*", "+@all", "-subscribe").Err())
	var logs syncBuffer
	rdb := r.NewClient(&redis.Options{Username: "nosub", Password: "pw"})
	c := newClient(t, r, rdb, fence.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), fence.WithLiveness(time.Second))
	holder := newClient(t, r, nil)
	l, err := holder.Acquire(ctx, "nosub")
	require.NoError(t, err)
	got := acquireAsync(ctx, c, "nosub")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "cannot subscribe") }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, l.Release(ctx))
	a := <-got
	require.NoError(t, a.err, "the waiter got the lock by its heartbeat")
	require.NoError(t, a.l.Release(ctx))
	lines := fenceLines(logs.String())
	require.Len(t, lines, 1, "%s", logs.String())
	assert.Contains(t, lines[0], "NOPERM this user has no permissions to run the 'subscribe' command; fix: as an admin, redis-cli"+
		hostPort(r.Addr)+" ACL SETUSER nosub +subscribe; the whole line fence needs: ")
	assert.NotContains(t, logs.String(), "unreachable")
}
