package fence_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// queueKeys are the queue's keys of a name for a client made by newClient.
func queueKeys(r *testenv.Redis, name string) (list, hash string) {
	return lockKey(r, name) + ":q", lockKey(r, name) + ":w"
}

// queued reports whether holder has a place in name's queue.
func queued(t testing.TB, rdb *redis.Client, r *testenv.Redis, name, holder string) bool {
	t.Helper()
	_, hash := queueKeys(r, name)
	ok, err := rdb.HExists(context.Background(), hash, holder).Result()
	require.NoError(t, err)
	return ok
}

// waitQueued waits until n holders have a place in name's queue.
func waitQueued(t testing.TB, r *testenv.Redis, name string, n int64) {
	t.Helper()
	_, hash := queueKeys(r, name)
	require.Eventually(t, func() bool {
		got, err := r.Client().HLen(context.Background(), hash).Result()
		return err == nil && got == n
	}, 20*time.Second, 5*time.Millisecond, "waiting for %d queued waiters of %s", n, name)
}

const waiterProcEnv = "FENCE_TEST_WAITER_PROC"

// waiterProcess is the child of the waiter-crash tests: it waits for a
// lock as holder $..._HOLDER with liveness $..._LIVENESS, says when it
// holds it, and waits to be killed.
func waiterProcess() {
	get := func(k string) string { return os.Getenv(waiterProcEnv + k) }
	liveness, _ := time.ParseDuration(get("_LIVENESS"))
	rdb := redis.NewClient(&redis.Options{Addr: get("")})
	c, err := fence.New(rdb, fence.WithPrefix(get("_PREFIX")), fence.WithLiveness(liveness))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	l, err := c.Acquire(context.Background(), get("_NAME"), fence.WithHolder(get("_HOLDER")), fence.WithWaitLimit(time.Minute))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("acquired", l.Token())
	select {}
}

// startWaiter starts a waiter process for name as holder and waits until
// it is queued.
func startWaiter(t *testing.T, r *testenv.Redis, name, holder string, liveness time.Duration) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), waiterProcEnv+"="+r.Addr, waiterProcEnv+"_PREFIX="+r.Prefix+"fence:",
		waiterProcEnv+"_NAME="+name, waiterProcEnv+"_HOLDER="+holder, waiterProcEnv+"_LIVENESS="+liveness.String())
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() { // report what the child says, e.g. an early error
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			t.Logf("waiter %s: %s", holder, sc.Text())
		}
	}()
	require.Eventually(t, func() bool { return queued(t, r.Client(), r, name, holder) }, 20*time.Second,
		5*time.Millisecond, "waiter process %s not queued", holder)
	return cmd
}

// acquireAsync runs Acquire in a goroutine; the result arrives on the
// channel with the time it returned.
type acquireResult struct {
	l   *fence.Lock
	err error
	at  time.Time
}

func acquireAsync(ctx context.Context, c *fence.Client, name string, opts ...fence.LockOption) <-chan acquireResult {
	ch := make(chan acquireResult, 1)
	go func() {
		l, err := c.Acquire(ctx, name, opts...)
		ch <- acquireResult{l, err, time.Now()}
	}()
	return ch
}

// No barging: while a live waiter queues, a free lock goes to it, not to
// a TryAcquire or a new Acquire that comes later (the TryAcquire's own
// call hands it over); and the lock goes round the queue in arrival
// order across clients.
func TestNoBarging(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 30*time.Second)
	holder := newClient(t, r, nil)
	a := newClient(t, r, nil)
	b := newClient(t, r, nil)
	held, err := holder.Acquire(ctx, "nb")
	require.NoError(t, err)
	gotA := acquireAsync(ctx, a, "nb", fence.WithHolder("a"))
	waitQueued(t, r, "nb", 1)
	gotB := acquireAsync(ctx, b, "nb", fence.WithHolder("b"))
	waitQueued(t, r, "nb", 2)

	// The lock's key vanishes without a release (deleted by hand): no
	// handover happened. A TryAcquire does not get it; it hands it to
	// the head of the queue instead.
	require.NoError(t, r.Client().Del(ctx, lockKey(r, "nb")).Err())
	_, err = holder.TryAcquire(ctx, "nb")
	require.ErrorIs(t, err, fence.ErrNotAcquired)
	first := <-gotA
	require.NoError(t, first.err)
	assert.Equal(t, "a", first.l.Holder(), "the head of the queue")
	assert.ErrorIs(t, held.Release(ctx), fence.ErrNotHeld)

	// A newcomer's Acquire queues behind b.
	gotC := acquireAsync(ctx, holder, "nb", fence.WithHolder("c"))
	waitQueued(t, r, "nb", 2)
	require.NoError(t, first.l.Release(ctx))
	second := <-gotB
	require.NoError(t, second.err)
	assert.Equal(t, "b", second.l.Holder())
	assert.Greater(t, second.l.Token(), first.l.Token())
	require.NoError(t, second.l.Release(ctx))
	third := <-gotC
	require.NoError(t, third.err)
	assert.Equal(t, "c", third.l.Holder())
	assert.Greater(t, third.l.Token(), second.l.Token())
	require.NoError(t, third.l.Release(ctx))
	list, hash := queueKeys(r, "nb")
	n, err := r.Client().Exists(ctx, list, hash).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "an emptied queue leaves no keys")
}

// A waiter process that dies in the queue costs the others at most its
// liveness deadline plus one heartbeat, never a lease: whether it dies at
// the head, in the middle, or after a handover made it the holder but
// before it read the message.
func TestWaiterCrash(t *testing.T) {
	t.Parallel()
	const (
		liveness = time.Second
		lease    = 30 * time.Second
		// The deadline plus a heartbeat (liveness/3), with room for a
		// loaded machine: far below the lease.
		bound = liveness + liveness/3 + 2*time.Second
	)
	for _, where := range []string{"head", "middle", "granted"} {
		t.Run(where, func(t *testing.T) {
			r := testenv.NewRedisServer(t)
			ctx := ctxT(t, 60*time.Second)
			opts := []fence.ClientOption{fence.WithLiveness(liveness), fence.WithLease(lease)}
			holder := newClient(t, r, nil, opts...)
			live := newClient(t, r, nil, opts...)
			name := "crash-" + where
			held, err := holder.Acquire(ctx, name)
			require.NoError(t, err)

			var front <-chan acquireResult // a live waiter ahead of the dying one
			if where == "middle" {
				front = acquireAsync(ctx, live, name, fence.WithHolder("front"))
				waitQueued(t, r, name, 1)
			}
			child := startWaiter(t, r, name, "dying", liveness)
			behind := acquireAsync(ctx, live, name, fence.WithHolder("behind"))
			queue := int64(2)
			if front != nil {
				queue = 3
			}
			waitQueued(t, r, name, queue)

			if where == "granted" {
				// Stopped, it cannot read the handover's message, nor
				// heartbeat; it dies holding the handover.
				require.NoError(t, child.Process.Signal(syscall.SIGSTOP))
				require.NoError(t, held.Release(ctx))
				require.Eventually(t, func() bool {
					h, _ := readLock(t, r.Client(), lockKey(r, name))
					return h == "dying"
				}, 10*time.Second, 5*time.Millisecond, "the handover went to the stopped waiter")
				require.NoError(t, child.Process.Kill())
			} else {
				require.NoError(t, child.Process.Kill())
			}
			_ = child.Wait()
			from := time.Now()
			switch where {
			case "middle": // the dead waiter's turn comes after the front's
				require.NoError(t, held.Release(ctx))
				f := <-front
				require.NoError(t, f.err)
				from = time.Now()
				require.NoError(t, f.l.Release(ctx))
			case "head":
				require.NoError(t, held.Release(ctx))
			}
			select {
			case b := <-behind:
				require.NoError(t, b.err)
				took := b.at.Sub(from)
				t.Logf("the lock moved on %v after the dead waiter's turn came (liveness %v, lease %v)", took, liveness, lease)
				assert.Less(t, took, bound, "a dead waiter held up the queue")
				require.NoError(t, b.l.Release(ctx))
			case <-time.After(lease):
				t.Fatal("the live waiter did not get the lock within a lease")
			}
		})
	}
}

// A thousand waiters whose contexts end while handovers race them: a
// handover to a waiter that is leaving is passed on at once, never held
// for a lease. Holders keep acquiring throughout, and when everyone is
// gone the lock is free and the queue empty. One waiter in 50 waits for
// as long as the test's context: however slow the machine (on a loaded
// one every short context may end before its first answer), the lock is
// then acquired, and a handover held for a lease would show as a gap
// before the next patient waiter's turn.
func TestWaitersLeavingWhileGrantsRace(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 120*time.Second)
	const (
		waiters = 1000
		lease   = 30 * time.Second
	)
	clients := make([]*fence.Client, 4)
	for i := range clients {
		clients[i] = newClient(t, r, r.NewClient(&redis.Options{PoolSize: 64}), fence.WithLease(lease))
	}
	var (
		mu    sync.Mutex
		times []time.Time // every acquisition
		got   atomic.Int64
		wg    sync.WaitGroup
	)
	record := func() {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
	}
	start := time.Now()
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Contexts end at scattered times across the run.
			wctx, cancel := context.WithTimeout(ctx, time.Duration(20+rand.IntN(1500))*time.Millisecond)
			patient := i%50 == 0
			if patient {
				wctx, cancel = ctx, func() {}
			}
			defer cancel()
			l, err := clients[i%len(clients)].Acquire(wctx, "race")
			if err != nil {
				assert.False(t, patient, "a waiter with the test's context did not acquire: %v", err)
				assert.ErrorIs(t, err, fence.ErrNotAcquired)
				return
			}
			got.Add(1)
			record()
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
			assert.NoError(t, l.Release(ctx))
		}()
	}
	wg.Wait()
	took := time.Since(start)
	mu.Lock()
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	var gap time.Duration
	for i := 1; i < len(times); i++ {
		gap = max(gap, times[i].Sub(times[i-1]))
	}
	mu.Unlock()
	t.Logf("%d of %d waiters acquired in %v; longest gap between acquisitions %v", got.Load(), waiters, took, gap)
	assert.GreaterOrEqual(t, got.Load(), int64(waiters/50), "every patient waiter acquired")
	assert.Less(t, gap, lease/3, "a handover to a leaving waiter was held")
	// Nothing is left behind: no holder, no place.
	require.Eventually(t, func() bool {
		list, hash := queueKeys(r, "race")
		n, err := r.Client().Exists(ctx, lockKey(r, "race"), list, hash).Result()
		return err == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond, "a lock or a place outlived every waiter")
	l, err := clients[0].TryAcquire(ctx, "race")
	require.NoError(t, err, "the lock is free")
	require.NoError(t, l.Release(ctx))
}

// A holder whose lease ran out releases after the queue gave the lock to
// the next waiter: it gets ErrNotHeld, and the new holder and the rest of
// the queue are intact.
func TestReleaseByExpiredHolderKeepsQueue(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 30*time.Second)
	c := newClient(t, r, nil, fence.WithLiveness(time.Second))
	// A lease that outlasts the queueing of both waiters however slow the
	// machine, shortened once they are queued: a 300 ms lease from the
	// start expired before the first waiter queued on a loaded machine,
	// and that waiter took the free lock without queueing.
	old, err := c.Acquire(ctx, "exp", fence.WithFixedLease(25*time.Second))
	require.NoError(t, err)
	next := acquireAsync(ctx, c, "exp", fence.WithHolder("next"))
	waitQueued(t, r, "exp", 1)
	last := acquireAsync(ctx, c, "exp", fence.WithHolder("last"))
	waitQueued(t, r, "exp", 2)
	require.NoError(t, old.Refresh(ctx, 300*time.Millisecond))
	n := <-next // at the old lease's expiry
	require.NoError(t, n.err)
	assert.Greater(t, n.l.Token(), old.Token())

	err = old.Release(ctx)
	assert.ErrorIs(t, err, fence.ErrNotHeld)
	h, tok := readLock(t, r.Client(), lockKey(r, "exp"))
	assert.Equal(t, "next", h, "the new holder keeps the lock")
	assert.Equal(t, n.l.Token(), tok)
	assert.True(t, queued(t, r.Client(), r, "exp", "last"), "the queue keeps its waiter")
	require.NoError(t, n.l.Err())
	require.NoError(t, n.l.Release(ctx))
	l := <-last
	require.NoError(t, l.err)
	require.NoError(t, l.l.Release(ctx))
}

// holding is one confirmed holding: acquired at from, released (with
// success) after to.
type holding struct {
	holder   string
	token    int64
	from, to time.Time
	sent     time.Time // when the Acquire call began
}

// FLUSHALL while 8 waiters in 4 clients (as 4 processes would be) take
// turns: the queue and the lock vanish; no two holdings that the server
// confirmed (Release found the lock still theirs) overlap; tokens increase
// across the flush (the clock floor); and every waiter keeps acquiring, or
// times out, within a heartbeat plus a lease.
func TestFlushAllMidQueue(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 120*time.Second)
	const (
		liveness = 900 * time.Millisecond
		lease    = time.Second
		limit    = liveness/3 + lease + 2*time.Second // + room for a loaded machine
	)
	clients := make([]*fence.Client, 4)
	for i := range clients {
		clients[i] = newClient(t, r, r.NewClient(&redis.Options{}), fence.WithLease(lease), fence.WithLiveness(liveness))
	}
	var (
		mu       sync.Mutex
		held     []holding
		afterFl  = map[string]int{}
		flushed  atomic.Bool
		deadline = time.Now().Add(6 * time.Second)
		wg       sync.WaitGroup
	)
	// A waiter goes on past the deadline until it has held the lock after
	// the flush (ctx bounds it): on a loaded machine the handovers of a
	// few seconds may not reach every waiter.
	done := func(me string) bool {
		if time.Now().Before(deadline) {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		return afterFl[me] > 0 || ctx.Err() != nil
	}
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[i%4]
			me := "w" + strconv.Itoa(i)
			for !done(me) {
				sent := time.Now()
				l, err := c.Acquire(ctx, "flush", fence.WithWaitLimit(limit))
				if err != nil {
					assert.ErrorIs(t, err, fence.ErrNotAcquired)
					// The limit ends the wait: not a bound on a loaded
					// machine's latency, so the slack is the limit again.
					assert.Less(t, time.Since(sent), 2*limit, "the wait outlived its limit")
					continue
				}
				from := time.Now()
				time.Sleep(2 * time.Millisecond)
				to := time.Now()
				if l.Release(ctx) == nil {
					mu.Lock()
					held = append(held, holding{me, l.Token(), from, to, sent})
					if flushed.Load() {
						afterFl[me]++
					}
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(2 * time.Second)
	require.NoError(t, r.Client().FlushAll(ctx).Err())
	flushed.Store(true)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d confirmed holdings, per waiter after the flush: %v", len(held), afterFl)
	require.NotEmpty(t, held)
	slices.SortFunc(held, func(a, b holding) int { return a.from.Compare(b.from) })
	for i := 1; i < len(held); i++ {
		assert.True(t, held[i-1].to.Before(held[i].from), "holdings overlap: %+v and %+v", held[i-1], held[i])
	}
	for i, a := range held {
		for _, b := range held[i+1:] {
			if a.from.Before(b.sent) && a.token >= b.token {
				t.Errorf("token order: %+v then %+v", a, b)
			}
		}
	}
	assert.Len(t, afterFl, 8, "every waiter acquired after the flush")
}

// The pub/sub connection is killed just before a handover: the grant's
// message is lost, and the waiter holds the lock at its next heartbeat
// (or when its connection's resubscription makes it heartbeat), long
// before the holder's lease.
func TestGrantWithPubSubKilled(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 60*time.Second)
	const liveness, lease = 3 * time.Second, 30 * time.Second
	holder := newClient(t, r, nil, fence.WithLease(lease))
	waiter := newClient(t, r, r.NewClient(&redis.Options{ClientName: "waiter"}), fence.WithLiveness(liveness))
	held, err := holder.Acquire(ctx, "pk")
	require.NoError(t, err)
	got := acquireAsync(ctx, waiter, "pk")
	waitQueued(t, r, "pk", 1)
	waitSubscribers(t, r, "pk", 1)
	killed, err := r.Client().ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, killed)
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	a := <-got
	require.NoError(t, a.err)
	took := a.at.Sub(released)
	t.Logf("the waiter held the lock %v after the release (liveness/3 = %v)", took, liveness/3)
	assert.Less(t, took, liveness/3+2*time.Second, "a lost grant message cost more than a heartbeat")
	require.NoError(t, a.l.Release(ctx))
}

// Redis restarts without its data while waiters queue: the queue and the
// counter are gone; the waiters find themselves out of the queue at their
// next heartbeat, join again, and get the lock, with tokens above every
// earlier one.
func TestRestartWithoutDataMidQueue(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 60*time.Second)
	const liveness = time.Second
	holder := newClient(t, r, nil)
	c := newClient(t, r, r.NewClient(&redis.Options{}), fence.WithLiveness(liveness))
	held, err := holder.Acquire(ctx, "rs")
	require.NoError(t, err)
	var gots []<-chan acquireResult
	for range 3 {
		gots = append(gots, acquireAsync(ctx, c, "rs"))
	}
	waitQueued(t, r, "rs", 3)
	require.NoError(t, r.Restart(false))
	// They get it one after another, in any order.
	for range gots {
		var a acquireResult
		select {
		case a = <-gots[0]:
		case a = <-gots[1]:
		case a = <-gots[2]:
		}
		require.NoError(t, a.err)
		assert.Greater(t, a.l.Token(), held.Token())
		require.NoError(t, a.l.Release(ctx))
	}
}

// A queue whose waiters all died expires by itself, a liveness period or
// two after the last heartbeat.
func TestAbandonedQueueExpires(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 60*time.Second)
	const liveness = 500 * time.Millisecond
	holder := newClient(t, r, nil)
	held, err := holder.Acquire(ctx, "ab")
	require.NoError(t, err)
	defer held.Release(ctx)
	child := startWaiter(t, r, "ab", "gone", liveness)
	require.NoError(t, child.Process.Kill())
	_ = child.Wait()
	killed := time.Now()
	list, hash := queueKeys(r, "ab")
	require.Eventually(t, func() bool {
		n, err := r.Client().Exists(ctx, list, hash).Result()
		return err == nil && n == 0
	}, 20*time.Second, 10*time.Millisecond, "the abandoned queue did not expire")
	t.Logf("expired %v after the last waiter died (liveness %v)", time.Since(killed), liveness)
}

// A Redis user that may not PUBLISH: handovers still happen in the
// release script, and the waiter learns of its handover at its next
// heartbeat (within liveness/3), not at the lease's end.
func TestHandoverWithoutPublish(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 60*time.Second)
	require.NoError(t, r.Client().Do(ctx, "ACL", "SETUSER", "nopub", "on", ">pw", "~*", "&*", "+@all", "-publish", "-spublish").Err())
	const liveness, lease = 1500 * time.Millisecond, 30 * time.Second
	rdb := r.NewClient(&redis.Options{Username: "nopub", Password: "pw"})
	holder := newClient(t, r, rdb, fence.WithLease(lease), fence.WithLogger(slog.New(slog.DiscardHandler)))
	waiter := newClient(t, r, r.NewClient(&redis.Options{Username: "nopub", Password: "pw"}), fence.WithLiveness(liveness))
	held, err := holder.Acquire(ctx, "np")
	require.NoError(t, err)
	got := acquireAsync(ctx, waiter, "np")
	waitQueued(t, r, "np", 1)
	waitSubscribers(t, r, "np", 1)
	time.Sleep(100 * time.Millisecond) // past the heartbeat that follows a new subscription
	released := time.Now()
	require.NoError(t, held.Release(ctx), "released although the notification was refused")
	a := <-got
	require.NoError(t, a.err)
	took := a.at.Sub(released)
	t.Logf("handed over without a message: the waiter held it %v after the release", took)
	assert.Less(t, took, liveness/3+2*time.Second)
	assert.Greater(t, a.l.Token(), held.Token())
	// The heartbeat that found the handover made the lock's expiry at
	// least its grant lease (min(lease, liveness): 1.5 s), not a whole
	// lease: the waiter counts that much, and its watchdog renews the
	// lock before it runs out.
	assert.LessOrEqual(t, time.Until(a.l.Deadline()), liveness, "the waiter counts the grant lease only")
	time.Sleep(2 * liveness)
	require.NoError(t, a.l.Err(), "renewed before the grant lease ran out")
	pttl, err := r.Client().PTTL(ctx, lockKey(r, "np")).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, liveness, "renewed to its whole lease")
	require.NoError(t, a.l.Release(ctx))
}

// WithReplicaSync on a handover: the waiter confirms the lock it was
// handed with a renewal and WAIT on its own connection, so the replica
// has it when Acquire returns.
func TestHandoverReplicaSync(t *testing.T) {
	t.Parallel()
	primary := testenv.NewRedisServer(t, testenv.WithRedisArgs("--repl-diskless-sync-delay", "0"))
	replica := testenv.NewRedisServer(t, testenv.WithRedisArgs("--replicaof", "127.0.0.1", portOf(primary.Addr)))
	ctx := ctxT(t, 30*time.Second)
	require.Eventually(t, func() bool {
		info, err := replica.Client().Info(ctx, "replication").Result()
		return err == nil && contains(info, "master_link_status:up")
	}, 10*time.Second, 50*time.Millisecond)
	holder := newClient(t, primary, nil)
	waiter := newClient(t, primary, primary.NewClient(&redis.Options{}))
	held, err := holder.Acquire(ctx, "hrs")
	require.NoError(t, err)
	got := acquireAsync(ctx, waiter, "hrs", fence.WithReplicaSync(1, 2*time.Second))
	waitQueued(t, primary, "hrs", 1)
	require.NoError(t, held.Release(ctx))
	a := <-got
	require.NoError(t, a.err)
	_, token := readLock(t, replica.Client(), lockKey(primary, "hrs"))
	assert.Equal(t, a.l.Token(), token, "the replica has the handed-over lock once Acquire returned")
	require.NoError(t, a.l.Release(ctx))

	// Without the replica's acknowledgement, the handover is passed on
	// and Acquire fails with a ReplicaSyncError.
	held, err = holder.Acquire(ctx, "hrs")
	require.NoError(t, err)
	got = acquireAsync(ctx, waiter, "hrs", fence.WithReplicaSync(2, 200*time.Millisecond))
	waitQueued(t, primary, "hrs", 1)
	require.NoError(t, held.Release(ctx))
	a = <-got
	var rse *fence.ReplicaSyncError
	require.ErrorAs(t, a.err, &rse)
	assert.Equal(t, 1, rse.Got)
	require.Eventually(t, func() bool {
		n, err := primary.Client().Exists(ctx, lockKey(primary, "hrs")).Result()
		return err == nil && n == 0
	}, 5*time.Second, 10*time.Millisecond, "the unconfirmed handover is released")
}

// oldScripts are the acquire and release scripts of the library before
// the queue (testdata/noqueue, as of fencelock 0.1): a client of that
// version, taking turns with this one on the same name during a rolling
// upgrade.
type oldScripts struct{ acquire, release *redis.Script }

func loadOldScripts(t *testing.T) oldScripts {
	t.Helper()
	a, err := os.ReadFile("testdata/noqueue/acquire.lua")
	require.NoError(t, err)
	r, err := os.ReadFile("testdata/noqueue/release.lua")
	require.NoError(t, err)
	return oldScripts{redis.NewScript(string(a)), redis.NewScript(string(r))}
}

// acquire runs the old acquire script once: the lock's value, or "" when
// held.
func (o oldScripts) tryAcquire(ctx context.Context, rdb *redis.Client, key, holder string, lease time.Duration) (string, error) {
	v, err := o.acquire.Run(ctx, rdb, []string{key, key + ":seq"}, holder, lease.Milliseconds(), int64(30*24*time.Hour/time.Millisecond)).Slice()
	if err != nil {
		return "", err
	}
	if v[0].(int64) == 0 {
		return "", nil
	}
	return v[1].(string), nil
}

func (o oldScripts) releaseLock(ctx context.Context, rdb *redis.Client, key, value string) (int64, error) {
	return o.release.Run(ctx, rdb, []string{key}, value, key+":ch", "0").Int64()
}

// A rolling upgrade: clients of the old version (its own acquire and
// release scripts, no queue) and of this one share a name. Holders never
// overlap (both versions take the lock only when its key is absent, and a
// handover replaces the releaser's own value in one script); tokens keep
// increasing (one counter, one rule); an old release, which hands nothing
// over, still reaches this version's queue (its message makes the first
// waiter heartbeat and take the lock); old clients barge past the queue,
// which only costs fairness.
func TestRollingUpgradeWithOldScripts(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 60*time.Second)
	old := loadOldScripts(t)
	rdb := r.Client()
	key := lockKey(r, "up")
	c := newClient(t, r, nil, fence.WithLiveness(3*time.Second))

	// An old holder; a new waiter queues; the old release hands nothing
	// over, yet the waiter gets the lock soon (not at a heartbeat: the
	// release message makes it look).
	v, err := old.tryAcquire(ctx, rdb, key, "old-1", 30*time.Second)
	require.NoError(t, err)
	require.NotEmpty(t, v)
	oldTok, _ := strconv.ParseInt(v[:strings.IndexByte(v, ':')], 10, 64)
	got := acquireAsync(ctx, c, "up")
	waitQueued(t, r, "up", 1)
	released := time.Now()
	n, err := old.releaseLock(ctx, rdb, key, v)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	a := <-got
	require.NoError(t, a.err)
	t.Logf("after an old release, the new waiter held the lock %v later", a.at.Sub(released))
	assert.Greater(t, a.l.Token(), oldTok)

	// While the new client holds it, the old acquire is refused.
	v, err = old.tryAcquire(ctx, rdb, key, "old-2", 30*time.Second)
	require.NoError(t, err)
	assert.Empty(t, v, "an old client does not take a lock a new one holds")
	require.NoError(t, a.l.Release(ctx))
	v, err = old.tryAcquire(ctx, rdb, key, "old-2", 30*time.Second)
	require.NoError(t, err)
	require.NotEmpty(t, v, "free again")
	tok2, _ := strconv.ParseInt(v[:strings.IndexByte(v, ':')], 10, 64)
	assert.Greater(t, tok2, a.l.Token(), "one counter, one rule")
	_, err = old.releaseLock(ctx, rdb, key, v)
	require.NoError(t, err)

	// Both versions hammer the name; each holding (checked by its own
	// release, which finds its value) is exclusive.
	var (
		mu   sync.Mutex
		held []holding
		wg   sync.WaitGroup
	)
	add := func(h holding) {
		mu.Lock()
		held = append(held, h)
		mu.Unlock()
	}
	// Until both versions held it a few times: the new ones pause between
	// acquisitions, so the lock is sometimes free for an old one to take.
	stop := time.Now().Add(20 * time.Second)
	var olds, news atomic.Int64
	enough := func() bool { return olds.Load() >= 10 && news.Load() >= 10 }
	for i := range 3 {
		wg.Add(2)
		go func() { // new version
			defer wg.Done()
			for time.Now().Before(stop) && !enough() {
				time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
				l, err := c.Acquire(ctx, "up", fence.WithWaitLimit(5*time.Second))
				if err != nil { // old clients barge: a new waiter may wait long
					assert.ErrorIs(t, err, fence.ErrNotAcquired)
					continue
				}
				from := time.Now()
				time.Sleep(time.Millisecond)
				to := time.Now()
				if l.Release(ctx) == nil {
					add(holding{"new", l.Token(), from, to, from})
					news.Add(1)
				}
			}
		}()
		go func() { // old version: its acquire retried in a loop
			defer wg.Done()
			me := "old-" + strconv.Itoa(i)
			for time.Now().Before(stop) && !enough() {
				v, err := old.tryAcquire(ctx, rdb, key, me, 30*time.Second)
				if !assert.NoError(t, err) {
					return
				}
				if v == "" {
					time.Sleep(time.Millisecond)
					continue
				}
				from := time.Now()
				time.Sleep(time.Millisecond)
				to := time.Now()
				if n, err := old.releaseLock(ctx, rdb, key, v); err == nil && n == 1 {
					tok, _ := strconv.ParseInt(v[:strings.IndexByte(v, ':')], 10, 64)
					add(holding{me, tok, from, to, from})
					olds.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(held, func(a, b holding) int { return a.from.Compare(b.from) })
	for i, h := range held {
		if i > 0 {
			assert.True(t, held[i-1].to.Before(h.from), "holders overlap: %+v and %+v", held[i-1], h)
			assert.Less(t, held[i-1].token, h.token, "tokens in holding order")
		}
	}
	t.Logf("%d holdings by the new version, %d by the old", news.Load(), olds.Load())
	assert.True(t, enough(), "both versions held the lock: %d new, %d old", news.Load(), olds.Load())
}

// Every key of a name, the queue's too, is in the name's cluster slot,
// and a handover on a cluster goes through sharded pub/sub.
func TestClusterHandover(t *testing.T) {
	t.Parallel()
	cl := testenv.SharedRedisCluster(t)
	ctx := ctxT(t, 30*time.Second)
	prefix := uniquePrefix(t)
	holder := newFenceOn(t, cl.Client(), prefix)
	waiter := newFenceOn(t, cl.NewClient(nil), prefix)
	for _, ns := range namesPerMaster(t, cl.Client(), prefix, "ho", 1) {
		name := ns[0]
		base := prefix + "{" + name + "}"
		held, err := holder.Acquire(ctx, name)
		require.NoError(t, err)
		got := acquireAsync(ctx, waiter, name)
		require.Eventually(t, func() bool {
			n, err := cl.Client().HLen(ctx, base+":w").Result()
			return err == nil && n == 1
		}, 10*time.Second, 5*time.Millisecond)
		slot, err := cl.Client().ClusterKeySlot(ctx, base).Result()
		require.NoError(t, err)
		for _, k := range []string{base + ":seq", base + ":q", base + ":w", base + ":ch"} {
			s, err := cl.Client().ClusterKeySlot(ctx, k).Result()
			require.NoError(t, err)
			assert.Equal(t, slot, s, "key %s", k)
		}
		released := time.Now()
		require.NoError(t, held.Release(ctx))
		a := <-got
		require.NoError(t, a.err)
		assert.Less(t, a.at.Sub(released), 5*time.Second, "handed over, not found at a heartbeat")
		assert.Greater(t, a.l.Token(), held.Token())
		require.NoError(t, a.l.Release(ctx))
	}
}

// replOffset reads a node's replication offset: the master's, or what a
// replica has processed.
func replOffset(t testing.TB, ctx context.Context, rdb *redis.Client, field string) int64 {
	t.Helper()
	info, err := rdb.Info(ctx, "replication").Result()
	require.NoError(t, err)
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no %s in INFO replication", field)
	return 0
}

// A lossy failover during a handover: the master hands the lock to the
// first waiter, then dies before its replica got the handover; the
// promoted replica still has the old holder's lock and the whole queue.
// The first waiter, which holds the lock as the dead master said, learns
// at its next renewal that it does not (the fence in the database stops
// its writes meanwhile); the old value expires; the next live waiter gets
// the lock, with a greater token, within about a lease and a liveness of
// the failover — nobody waits forever, and nothing is left held.
func TestClusterLossyFailoverDuringHandover(t *testing.T) {
	t.Parallel() // with the other fault tests on private topologies: they mostly wait
	waitDialProbes(t)
	cl := testenv.NewRedisCluster(t)
	ctx := ctxT(t, 90*time.Second)
	prefix := uniquePrefix(t)
	const lease, liveness = 2 * time.Second, time.Second
	opts := func() *redis.ClusterOptions { return &redis.ClusterOptions{DialerRetries: recommendedDialerRetries} }
	holder := newFenceOn(t, cl.NewClient(opts()), prefix, fence.WithLease(lease))
	first := newFenceOn(t, cl.NewClient(opts()), prefix, fence.WithLease(lease), fence.WithLiveness(liveness))
	second := newFenceOn(t, cl.NewClient(opts()), prefix, fence.WithLease(lease), fence.WithLiveness(liveness))
	victim, replica := cl.Nodes[0], cl.Nodes[3] // replicas of master i follow the masters
	name := namesPerMaster(t, cl.Client(), prefix, "lf", 1)[victim.Addr][0]
	hash := prefix + "{" + name + "}:w"
	held, err := holder.Acquire(ctx, name, fence.WithReplicaSync(1, 5*time.Second))
	require.NoError(t, err)
	waiters := func(n int64) func() bool {
		return func() bool {
			got, err := victim.Client().HLen(ctx, hash).Result()
			return err == nil && got == n
		}
	}
	gotA := acquireAsync(ctx, first, name)
	require.Eventually(t, waiters(1), 10*time.Second, 5*time.Millisecond)
	gotB := acquireAsync(ctx, second, name)
	require.Eventually(t, waiters(2), 10*time.Second, 5*time.Millisecond)
	// The replica has the queue; from now on it misses every write.
	target := replOffset(t, ctx, victim.Client(), "master_repl_offset")
	require.Eventually(t, func() bool { return replOffset(t, ctx, replica.Client(), "slave_repl_offset") >= target },
		10*time.Second, 5*time.Millisecond, "the replica did not catch up")
	require.NoError(t, replica.MissWrites(ctx, victim.Redis))

	require.NoError(t, held.Release(ctx)) // handed to the first waiter, on the victim only
	a := <-gotA
	require.NoError(t, a.err)
	require.NoError(t, victim.Kill())
	require.NoError(t, replica.Resume())
	require.NoError(t, replica.Failover(ctx, testenv.FailoverTakeover))
	promoted := time.Now()

	select {
	case <-a.l.Done():
		t.Logf("the first waiter learnt %v after the promotion: %v", time.Since(promoted), a.l.Err())
		assert.ErrorIs(t, a.l.Err(), fence.ErrLockLost)
	case <-time.After(20 * time.Second):
		t.Fatal("the first waiter never learnt that the promoted replica had not handed it the lock")
	}
	select {
	case b := <-gotB:
		require.NoError(t, b.err)
		t.Logf("the next waiter held the lock %v after the promotion", b.at.Sub(promoted))
		assert.Greater(t, b.l.Token(), a.l.Token())
		require.NoError(t, b.l.Release(ctx))
	case <-time.After(30 * time.Second):
		t.Fatal("the next waiter did not get the lock within 30 s of the promotion (lease 2 s, liveness 1 s)")
	}
}
