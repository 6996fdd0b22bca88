package fence_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// The same holder id gets its own lock back: the same *Lock within a
// client, the same token, the lease restarted; one Release ends it.
func TestReacquireBySameHolder(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	rec := newRecorder()
	c := newClient(t, r, nil, fence.WithObserver(rec))
	l, err := c.TryAcquire(ctx, "re", fence.WithHolder("w1"), fence.WithFixedLease(2*time.Second))
	require.NoError(t, err)
	again, err := c.Acquire(ctx, "re", fence.WithHolder("w1"), fence.WithFixedLease(20*time.Second))
	require.NoError(t, err)
	assert.Same(t, l, again, "the client's own lock is handed back")
	assert.Equal(t, l.Token(), again.Token())
	pttl, err := r.Client().PTTL(ctx, lockKey(r, "re")).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, 10*time.Second, "the lease restarted with the new acquisition's")
	assert.True(t, l.Deadline().After(time.Now().Add(10*time.Second)), "the local deadline moved too")
	acq := all[fence.AcquireEvent](rec)
	require.Len(t, acq, 2)
	assert.False(t, acq[0].Reacquired)
	assert.True(t, acq[1].Reacquired)

	_, err = c.TryAcquire(ctx, "re", fence.WithHolder("w2"))
	assert.ErrorIs(t, err, fence.ErrNotAcquired, "another holder id is excluded")

	require.NoError(t, l.Release(ctx))
	assert.ErrorIs(t, again.Release(ctx), fence.ErrNotHeld, "not counted: one Release ended it")
	n, err := r.Client().Exists(ctx, lockKey(r, "re")).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

// The reply to an acquisition is lost (the connection is blackholed past
// the call's deadline, then restored: the script ran, nobody heard). The
// retry with the same holder id gets the lock at once, with the token the
// server handed out, instead of waiting a whole lease.
func TestReacquireAfterLostReply(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	p, rdb := proxied(t, r.Addr, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1})
	ctx := ctxT(t, 30*time.Second)
	c := newClient(t, r, rdb, fence.WithHolder("job-42"))
	// Warm the connection and the script cache.
	warm, err := c.TryAcquire(ctx, "warm")
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))

	p.Blackhole()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.TryAcquire(short, "lost-reply")
	cancel()
	require.ErrorIs(t, err, fence.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	p.Restore() // the held request reaches the server now
	var serverToken int64
	require.Eventually(t, func() bool {
		v, err := r.Client().Get(ctx, lockKey(r, "lost-reply")).Result()
		if err != nil {
			return false
		}
		tok, holder, _ := strings.Cut(v, ":")
		serverToken, _ = strconv.ParseInt(tok, 10, 64)
		return holder == "job-42"
	}, 10*time.Second, 5*time.Millisecond, "the blackholed acquisition reached the server")

	start := time.Now()
	l, err := c.TryAcquire(ctx, "lost-reply")
	require.NoError(t, err, "the retry gets the lock its lost reply was for")
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, serverToken, l.Token())
	require.NoError(t, l.Release(ctx))
}

const holderProcEnv = "FENCE_TEST_HOLDER_PROC"

// holderProcess is the child of TestReacquireFromAnotherProcess: it
// acquires a lock with a fixed holder id, prints its token and waits to
// be killed (a crash: no Release).
func holderProcess() {
	addr, prefix := os.Getenv(holderProcEnv), os.Getenv(holderProcEnv+"_PREFIX")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	c, err := fence.New(rdb, fence.WithPrefix(prefix))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	var opts []fence.LockOption
	if h := os.Getenv(holderProcEnv + "_HOLDER"); h != "" {
		opts = append(opts, fence.WithHolder(h))
	}
	l, err := c.Acquire(context.Background(), "proc", opts...)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("token", l.Token(), l.Holder())
	select {}
}

// A process holds a lock and crashes; its successor, restarted with the
// same holder id, gets the lock back at once with the same token, instead
// of waiting out the dead process's lease. Another holder id still
// waits.
func TestReacquireFromAnotherProcess(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 30*time.Second)
	child, token, _ := startHolderProcess(t, r, "host-a/worker-1")
	require.NoError(t, child.Process.Kill()) // crash: no release
	_ = child.Wait()

	c := newClient(t, r, nil)
	_, err := c.TryAcquire(ctx, "proc")
	assert.ErrorIs(t, err, fence.ErrNotAcquired, "another holder id waits for the dead lease")
	start := time.Now()
	l, err := c.TryAcquire(ctx, "proc", fence.WithHolder("host-a/worker-1"))
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, token, l.Token(), "the same acquisition, its token kept")
	require.NoError(t, l.Release(ctx))
}

// startHolderProcess starts a process that acquires "proc" with the
// package's defaults (and holder id holder, unless ""), and returns once
// it holds the lock, with its token and holder id.
func startHolderProcess(t *testing.T, r *testenv.Redis, holder string) (*exec.Cmd, int64, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holderProcEnv+"="+r.Addr, holderProcEnv+"_PREFIX="+r.Prefix+"fence:",
		holderProcEnv+"_HOLDER="+holder)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	f := strings.Fields(line)
	require.Len(t, f, 3, "child said %q", line)
	require.Equal(t, "token", f[0], "child said %q", line)
	token, err := strconv.ParseInt(f[1], 10, 64)
	require.NoError(t, err)
	return cmd, token, f[2]
}

// The default holder id names the process (host and pid) and differs per
// acquisition; a caller's own id wins.
func TestDefaultHolderNamesTheProcess(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil)
	host, err := os.Hostname()
	require.NoError(t, err)
	prefix := fence.HostPart(host) + ":" + strconv.Itoa(os.Getpid()) + ":"
	a, err := c.Acquire(ctx, "a")
	require.NoError(t, err)
	b, err := c.Acquire(ctx, "b")
	require.NoError(t, err)
	for _, l := range []*fence.Lock{a, b} {
		assert.True(t, strings.HasPrefix(l.Holder(), prefix), "holder %q names host and pid (%q)", l.Holder(), prefix)
		assert.Len(t, l.Holder(), len(prefix)+11, "11 characters of randomness")
		info, err := c.Inspect(ctx, l.Name())
		require.NoError(t, err)
		assert.Equal(t, l.Holder(), info.Holder, "stored as the holder id")
	}
	assert.NotEqual(t, a.Holder(), b.Holder(), "a new id per acquisition")
	own, err := c.Acquire(ctx, "own", fence.WithHolder("billing/worker-7"))
	require.NoError(t, err)
	assert.Equal(t, "billing/worker-7", own.Holder())

	assert.Equal(t, "inventory-sync-~9z-canary-euw1-b", fence.HostPart("inventory-sync-worker-deployment-7c9d8f6b5d-x2x9z-canary-euw1-b"),
		"a long name keeps its start and its end, 32 bytes")
	assert.Equal(t, "worker-3", fence.HostPart("worker-3.prod.example.com"), "the first label")
	assert.Equal(t, "we_rd_host", fence.HostPart("we rd:host"), "bytes other than letters, digits, - and _ replaced")
}
