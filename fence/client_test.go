package fence_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// Guard's Lease, declared locally: fence must not import guard, and a
// *Lock must satisfy it by its method set.
type lease interface {
	Name() string
	Token() int64
	Holder() string
}

var _ lease = (*fence.Lock)(nil)

func TestAcquireRelease(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil)

	l, err := c.Acquire(ctx, "job")
	require.NoError(t, err)
	assert.Equal(t, "job", l.Name())
	assert.LessOrEqual(t, len(l.Holder()), 52, "a default holder id: <host>:<pid>:<random>, at most 52 bytes")
	assert.Positive(t, l.Token())
	assert.NoError(t, l.Err())
	assert.NoError(t, l.Context().Err())
	assert.True(t, l.Deadline().After(time.Now().Add(fence.DefaultLease*2/3)), "deadline %v: about a default lease away", l.Deadline())

	holder, token := readLock(t, r.Client(), lockKey(r, "job"))
	assert.Equal(t, l.Holder(), holder)
	assert.Equal(t, l.Token(), token)

	_, err = c.TryAcquire(ctx, "job")
	assert.ErrorIs(t, err, fence.ErrNotAcquired)

	require.NoError(t, l.Release(ctx))
	assert.ErrorIs(t, l.Err(), fence.ErrReleased)
	<-l.Done()
	n, err := r.Client().Exists(ctx, lockKey(r, "job")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "release deletes the lock key")

	err = l.Release(ctx)
	assert.ErrorIs(t, err, fence.ErrNotHeld, "double release")
	assert.Contains(t, err.Error(), "already released")

	l2, err := c.TryAcquire(ctx, "job")
	require.NoError(t, err)
	assert.Greater(t, l2.Token(), l.Token())
	require.NoError(t, l2.Release(ctx))
}

func TestWithHolder(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil, fence.WithHolder("worker-1"))
	l, err := c.TryAcquire(ctx, "h")
	require.NoError(t, err)
	assert.Equal(t, "worker-1", l.Holder())
	// Another holder id is excluded.
	_, err = c.TryAcquire(ctx, "h", fence.WithHolder("worker-2"))
	assert.ErrorIs(t, err, fence.ErrNotAcquired)
	require.NoError(t, l.Release(ctx))
}

func TestReleaseAfterExpiryKeepsNewHolder(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil)

	old, err := c.TryAcquire(ctx, "exp", fence.WithFixedLease(200*time.Millisecond))
	require.NoError(t, err)
	select {
	case <-old.Done():
	case <-ctx.Done():
		t.Fatal("fixed lease lock not cancelled at its deadline")
	}
	assert.ErrorIs(t, old.Err(), fence.ErrLockLost)

	// Wait for the server to expire it, then a new holder takes it.
	var cur *fence.Lock
	require.Eventually(t, func() bool {
		cur, err = c.TryAcquire(ctx, "exp")
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	assert.Greater(t, cur.Token(), old.Token())

	err = old.Release(ctx)
	assert.ErrorIs(t, err, fence.ErrNotHeld)
	h, _ := readLock(t, r.Client(), lockKey(r, "exp"))
	assert.Equal(t, cur.Holder(), h, "the stale release deleted nothing of the new holder")
	require.NoError(t, cur.Release(ctx))
}

func TestReleaseByOtherHolderSameID(t *testing.T) {
	t.Parallel()
	// Same holder id, different token: a stale release must not delete.
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil, fence.WithHolder("same"))
	old, err := c.TryAcquire(ctx, "x", fence.WithFixedLease(150*time.Millisecond))
	require.NoError(t, err)
	<-old.Done()
	// Once the server expired it, the same holder id gets a new
	// acquisition, not the expired one back.
	require.Eventually(t, func() bool {
		n, err := r.Client().Exists(ctx, lockKey(r, "x")).Result()
		return err == nil && n == 0
	}, 5*time.Second, 5*time.Millisecond)
	var cur *fence.Lock
	require.Eventually(t, func() bool {
		cur, err = c.TryAcquire(ctx, "x")
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	assert.Greater(t, cur.Token(), old.Token())
	assert.ErrorIs(t, old.Release(ctx), fence.ErrNotHeld)
	n, err := r.Client().Exists(ctx, lockKey(r, "x")).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	require.NoError(t, cur.Release(ctx))
}

func TestReleaseDetachedFromCancelledContext(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	c := newClient(t, r, nil)
	l, err := c.TryAcquire(ctxT(t, 5*time.Second), "rc")
	require.NoError(t, err)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, l.Release(cancelled))
	n, err := r.Client().Exists(ctxT(t, 5*time.Second), lockKey(r, "rc")).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestAcquireWaitsForRelease(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	rec := newRecorder()
	c1 := newClient(t, r, nil)
	c2 := newClient(t, r, nil, fence.WithObserver(rec))

	held, err := c1.Acquire(ctx, "w", fence.WithLease(time.Minute)) // only the release message can hand it over fast
	require.NoError(t, err)
	got := make(chan *fence.Lock, 1)
	go func() {
		l, err := c2.Acquire(ctx, "w")
		assert.NoError(t, err)
		got <- l
	}()
	// Wait until the waiter has subscribed (it is then past its first
	// attempt), so that the release is what wakes it.
	waitSubscribers(t, r, "w", 1)
	select {
	case <-got:
		t.Fatal("acquired while held")
	default:
	}
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	select {
	case l := <-got:
		require.NotNil(t, l)
		// Far below the minute-long lease: the release message woke the waiter.
		assert.Less(t, time.Since(released), 10*time.Second)
		assert.Greater(t, l.Token(), held.Token())
		require.NoError(t, l.Release(ctx))
	case <-ctx.Done():
		t.Fatal("waiter not woken by the release")
	}
	assert.Equal(t, 1, rec.count("waiting"))
	require.Equal(t, 1, rec.count("acquired"))
	acq := all[fence.AcquireEvent](rec)[0]
	assert.Positive(t, acq.Waited)
	assert.GreaterOrEqual(t, acq.Duration, acq.Waited)
}

func TestAcquireWakesOnExpiry(t *testing.T) {
	t.Parallel()
	// No release message: the holder's lease just runs out. The waiter
	// wakes when the PTTL it got back elapses.
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	c := newClient(t, r, nil)
	held, err := c.TryAcquire(ctx, "e", fence.WithFixedLease(400*time.Millisecond))
	require.NoError(t, err)
	l, err := c.Acquire(ctx, "e")
	require.NoError(t, err)
	assert.Greater(t, l.Token(), held.Token())
	assert.ErrorIs(t, held.Err(), fence.ErrLockLost)
	require.NoError(t, l.Release(ctx))
}

func TestAcquireLimits(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	c := newClient(t, r, nil)
	held, err := c.Acquire(ctx, "lim")
	require.NoError(t, err)
	defer held.Release(ctx)

	_, err = c.Acquire(ctx, "lim", fence.WithWaitLimit(200*time.Millisecond))
	assert.ErrorIs(t, err, fence.ErrNotAcquired)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "wait limit")

	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = c.Acquire(cctx, "lim")
	assert.ErrorIs(t, err, fence.ErrNotAcquired)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	cctx, cancel2 := context.WithCancel(ctx)
	cancel2()
	_, err = c.Acquire(cctx, "lim")
	assert.ErrorIs(t, err, fence.ErrNotAcquired)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestDo(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil)
	var ran bool
	err := c.Do(ctx, "do", func(ctx context.Context, l *fence.Lock) error {
		ran = true
		assert.NoError(t, ctx.Err())
		_, err := c.TryAcquire(ctx, "do")
		assert.ErrorIs(t, err, fence.ErrNotAcquired)
		return nil
	})
	require.NoError(t, err)
	assert.True(t, ran)
	n, err := r.Client().Exists(ctx, lockKey(r, "do")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "Do releases")

	boom := errors.New("boom")
	err = c.Do(ctx, "do", func(context.Context, *fence.Lock) error { return boom })
	assert.ErrorIs(t, err, boom)

	// Loss while fn runs: fn's context is cancelled, Do reports the loss.
	err = c.Do(ctx, "do", func(ctx context.Context, l *fence.Lock) error {
		require.NoError(t, r.Client().Del(ctx, lockKey(r, "do")).Err())
		<-ctx.Done()
		return ctx.Err()
	}, fence.WithLease(300*time.Millisecond))
	assert.ErrorIs(t, err, fence.ErrLockLost)
	assert.ErrorIs(t, err, context.Canceled, "fn's error is kept next to the loss")
	assert.NotContains(t, err.Error(), "\n", "fn's error and the loss on one line")
}

func TestClose(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	rec := newRecorder()
	c, err := fence.New(r.Client(), fence.WithPrefix(r.Prefix+"fence:"), fence.WithObserver(rec))
	require.NoError(t, err)
	a, err := c.Acquire(ctx, "a")
	require.NoError(t, err)
	b, err := c.Acquire(ctx, "b", fence.WithFixedLease(5*time.Second))
	require.NoError(t, err)
	c2 := newClient(t, r, nil)
	held, err := c2.Acquire(ctx, "held")
	require.NoError(t, err)
	waitErr := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "held")
		waitErr <- err
	}()
	rec.waitCount(t, "waiting", 1)

	require.NoError(t, c.Close(ctx))
	assert.ErrorIs(t, a.Err(), fence.ErrClosed)
	assert.ErrorIs(t, b.Err(), fence.ErrClosed)
	assert.ErrorIs(t, <-waitErr, fence.ErrClosed)
	n, err := r.Client().Exists(ctx, lockKey(r, "a"), lockKey(r, "b")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "Close released the held locks")
	assert.Equal(t, 2, rec.count("released"))

	_, err = c.Acquire(ctx, "a")
	assert.ErrorIs(t, err, fence.ErrClosed)
	_, err = c.TryAcquire(ctx, "a")
	assert.ErrorIs(t, err, fence.ErrClosed)
	assert.ErrorIs(t, c.Do(ctx, "a", func(context.Context, *fence.Lock) error { return nil }), fence.ErrClosed)
	assert.ErrorIs(t, a.Release(ctx), fence.ErrClosed)
	assert.ErrorIs(t, b.Refresh(ctx, time.Second), fence.ErrClosed)
	assert.ErrorIs(t, c.Close(ctx), fence.ErrClosed)
	require.NoError(t, held.Release(ctx))
}

func TestTokensIncrease(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 30*time.Second)
	c := newClient(t, r, nil)
	rdb := r.Client()
	var last int64
	next := func(what string) {
		t.Helper()
		l, err := c.TryAcquire(ctx, "tok")
		require.NoError(t, err, what)
		assert.Greater(t, l.Token(), last, what)
		last = l.Token()
		require.NoError(t, l.Release(ctx))
	}
	for range 5 {
		next("released")
	}
	// A counter above the clock wins: +1.
	beforeHigh := last
	high := last + 1_000_000_000
	require.NoError(t, rdb.Set(ctx, lockKey(r, "tok")+":seq", high, 0).Err())
	l, err := c.TryAcquire(ctx, "tok")
	require.NoError(t, err)
	assert.Equal(t, high+1, l.Token())
	require.NoError(t, l.Release(ctx))
	// The clock is now behind the counter, as after the clock ran
	// backwards: the counter keeps the last token, the next is one above.
	l, err = c.TryAcquire(ctx, "tok")
	require.NoError(t, err)
	assert.Equal(t, high+2, l.Token(), "a clock behind the counter")
	require.NoError(t, l.Release(ctx))
	// A counter set back below the clock: the clock floor still gives a
	// token above every clock-based one handed out before.
	require.NoError(t, rdb.Set(ctx, lockKey(r, "tok")+":seq", 5, 0).Err())
	last = beforeHigh
	next("counter reset low: clock floor")
	require.NoError(t, rdb.Del(ctx, lockKey(r, "tok")+":seq").Err())
	next("counter deleted by hand")
	require.NoError(t, r.Flush(ctx))
	next("FLUSHALL")
	require.NoError(t, r.Restart(false))
	next("restart without data")
	// Expired, not released.
	l, err = c.TryAcquire(ctx, "tok", fence.WithFixedLease(150*time.Millisecond))
	require.NoError(t, err)
	assert.Greater(t, l.Token(), last)
	last = l.Token()
	require.Eventually(t, func() bool {
		l, err = c.TryAcquire(ctx, "tok")
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	assert.Greater(t, l.Token(), last, "after expiry")
	require.NoError(t, l.Release(ctx))
}

func TestMutualExclusion(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 60*time.Second)
	const clients, goroutines, rounds = 3, 6, 15
	var inside, max, total atomic.Int64
	var lastToken atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		c := newClient(t, r, nil, fence.WithLease(2*time.Second))
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					l, err := c.Acquire(ctx, "mutex")
					if !assert.NoError(t, err) {
						return
					}
					n := inside.Add(1)
					for m := max.Load(); n > m && !max.CompareAndSwap(m, n); m = max.Load() {
					}
					// Tokens of successive holders strictly increase.
					assert.Greater(t, l.Token(), lastToken.Load())
					lastToken.Store(l.Token())
					time.Sleep(100 * time.Microsecond)
					total.Add(1)
					inside.Add(-1)
					assert.NoError(t, l.Release(ctx))
				}
			}()
		}
	}
	wg.Wait()
	assert.EqualValues(t, 1, max.Load(), "critical sections overlapped")
	assert.EqualValues(t, clients*goroutines*rounds, total.Load())
}

func TestReplicaSync(t *testing.T) {
	t.Parallel()
	// A standalone server has no replica: asking for one gets 0 acks, the
	// lock is released and the call fails.
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 10*time.Second)
	c := newClient(t, r, nil)
	_, err := c.TryAcquire(ctx, "rs", fence.WithReplicaSync(1, 100*time.Millisecond))
	require.ErrorIs(t, err, fence.ErrNotAcquired)
	var rse *fence.ReplicaSyncError
	require.ErrorAs(t, err, &rse)
	assert.Equal(t, 1, rse.Want)
	assert.Equal(t, 0, rse.Got)
	n, err := r.Client().Exists(ctx, lockKey(r, "rs")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the lock key is gone")

	// Zero replicas asked: no WAIT, acquired.
	l, err := c.TryAcquire(ctx, "rs", fence.WithReplicaSync(0, 0))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
}

func TestReplicaSyncWithReplica(t *testing.T) {
	t.Parallel()
	primary := testenv.NewRedisServer(t, testenv.WithRedisArgs("--repl-diskless-sync-delay", "0"))
	replica := testenv.NewRedisServer(t, testenv.WithRedisArgs("--replicaof", "127.0.0.1", portOf(primary.Addr)))
	ctx := ctxT(t, 20*time.Second)
	require.Eventually(t, func() bool {
		info, err := replica.Client().Info(ctx, "replication").Result()
		return err == nil && contains(info, "master_link_status:up")
	}, 10*time.Second, 50*time.Millisecond)
	c := newClient(t, primary, nil)
	l, err := c.TryAcquire(ctx, "rs", fence.WithReplicaSync(1, 2*time.Second))
	require.NoError(t, err)
	_, token := readLock(t, replica.Client(), lockKey(primary, "rs")) // fails when the replica lacks it
	assert.Equal(t, l.Token(), token, "the replica has the lock once acquire returned")
	require.NoError(t, l.Release(ctx))
}

func portOf(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestOnePubSubConnectionPerClient(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 20*time.Second)
	holder := newClient(t, r, nil)
	rdb := r.NewClient(&redis.Options{ClientName: "waiters"})
	waiters := newClient(t, r, rdb)
	const names = 10
	var held []*fence.Lock
	for i := range names {
		l, err := holder.Acquire(ctx, "p"+string(rune('a'+i)))
		require.NoError(t, err)
		held = append(held, l)
	}
	var wg sync.WaitGroup
	for i := range names {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := waiters.Acquire(ctx, "p"+string(rune('a'+i)))
				if assert.NoError(t, err) {
					assert.NoError(t, l.Release(ctx))
				}
			}()
		}
	}
	// Wait until every name's channel has its subscriber.
	for i := range names {
		waitSubscribers(t, r, "p"+string(rune('a'+i)), 1)
	}
	list, err := r.Client().ClientList(ctx).Result()
	require.NoError(t, err)
	pubsubConns := 0
	for _, line := range splitLines(list) {
		if contains(line, "name=waiters") && (contains(line, "cmd=subscribe") || contains(line, "cmd=ping") || !contains(line, " sub=0 ")) {
			pubsubConns++
		}
	}
	assert.Equal(t, 1, pubsubConns, "30 waiters on 10 names share one pub/sub connection:\n%s", list)
	for _, l := range held {
		require.NoError(t, l.Release(ctx))
	}
	wg.Wait()
}

func splitLines(s string) []string { return strings.Split(strings.TrimSpace(s), "\n") }
