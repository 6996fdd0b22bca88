package fence_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime"
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

// schedSlack allows for timer and scheduling delay on a loaded machine
// when checking that a loss was signalled by the local deadline.
const schedSlack = 750 * time.Millisecond

func TestWatchdogKeepsLockAlive(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 60*time.Second)
	rec := newRecorder()
	// Renewals every lease/3: a renewal may be a lease late (a loaded
	// machine) before the lock is lost.
	const lease = 1500 * time.Millisecond
	c := newClient(t, r, nil, fence.WithLease(lease), fence.WithObserver(rec))
	start := time.Now()
	l, err := c.Acquire(ctx, "alive")
	require.NoError(t, err)
	// Held for 4 leases: without renewals the server expires the key
	// after one.
	time.Sleep(4 * lease)
	assert.NoError(t, l.Err(), "held 4x its lease while Redis is reachable")
	pttl, err := r.Client().PTTL(ctx, lockKey(r, "alive")).Result()
	require.NoError(t, err)
	assert.Positive(t, pttl)
	renewed := rec.count("renewed")
	t.Logf("%d renewals in %v (one per %v expected)", renewed, time.Since(start), lease/3)
	// 12 are due; the first 3 leases need at least 3 to keep the key.
	assert.GreaterOrEqual(t, renewed, 4)
	assert.Zero(t, rec.count("lost"))
	require.NoError(t, l.Release(ctx))
}

// TestNoRenewalAfterRelease counts the renewal scripts the client sends
// (a hook on its go-redis client) after Release and after Close. The
// watchdog takes a lock out of its schedule before Release sends the
// release; a renewal round that had already taken the lock may still be
// on its way out then, so one renewal after Release is allowed: a
// watchdog that kept renewing would send one every lease/3.
func TestNoRenewalAfterRelease(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 60*time.Second)
	var renewCalls atomic.Int64
	rdb := r.NewClient(nil)
	rdb.AddHook(countScripts{n: &renewCalls, marker: "PEXPIRE', KEYS[1], ARGV[3]"})
	// Long enough that a loaded machine does not lose the lock before
	// Release; renewals every 500 ms.
	const lease = 1500 * time.Millisecond
	const watch = 2 * lease // 6 renewals would be due
	rec := newRecorder()
	c := newClient(t, r, rdb, fence.WithLease(lease), fence.WithObserver(rec))
	l, err := c.Acquire(ctx, "nr")
	require.NoError(t, err)
	rec.waitCount(t, "renewed", 2)
	require.NoError(t, l.Release(ctx))
	afterRelease := renewCalls.Load()
	renewed := rec.count("renewed")
	assert.GreaterOrEqual(t, afterRelease, int64(2), "the hook sees renewals")
	time.Sleep(watch)
	late := renewCalls.Load() - afterRelease
	t.Logf("renewals sent after Release: %d (in flight when it was called)", late)
	assert.LessOrEqual(t, late, int64(1), "renewals were sent after Release")
	assert.LessOrEqual(t, rec.count("renewed")-renewed, 1, "renewals were applied after Release")
	n, err := r.Client().Exists(ctx, lockKey(r, "nr")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the released key stays deleted")

	// And after Close.
	l2, err := c.Acquire(ctx, "nr2")
	require.NoError(t, err)
	rec.waitCount(t, "renewed", rec.count("renewed")+1)
	require.NoError(t, c.Close(ctx))
	afterClose := renewCalls.Load()
	time.Sleep(watch)
	assert.Equal(t, afterClose, renewCalls.Load(), "a renewal was sent after Close")
	assert.ErrorIs(t, l2.Err(), fence.ErrClosed)
}

// countScripts counts the renewal scripts a client sends (EVALSHA and
// EVAL, single or pipelined), recognising the script by its sha.
type countScripts struct {
	n      *atomic.Int64
	marker string
}

func (h countScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}
func (h countScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}
func (h countScripts) count(cmd redis.Cmder) {
	if isRenew(cmd) {
		h.n.Add(1)
	}
}

// isRenew recognises the renewal script: two args after the key, the
// last the lease in ms (acquire has two keys, release three args).
func isRenew(cmd redis.Cmder) bool {
	a := cmd.Args()
	if len(a) != 6 {
		return false
	}
	name, _ := a[0].(string)
	if name != "evalsha" && name != "eval" {
		return false
	}
	nk, _ := a[2].(int)
	_, leaseArg := a[5].(int64)
	return nk == 1 && leaseArg
}

func TestRenewalsArePipelined(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	var pipelines, renewsInPipelines, single atomic.Int64
	rdb := r.NewClient(nil)
	rdb.AddHook(pipeCounter{pipes: &pipelines, renews: &renewsInPipelines, single: &single})
	const lease, n = 1500 * time.Millisecond, 50
	c := newClient(t, r, rdb, fence.WithLease(lease))
	var locks []*fence.Lock
	for i := range n {
		l, err := c.TryAcquire(ctx, "pl"+itoa(i))
		require.NoError(t, err)
		locks = append(locks, l)
	}
	// Every lock renewed several times (renewals run every lease/3).
	require.Eventually(t, func() bool { return renewsInPipelines.Load() >= n*3 }, 10*time.Second, time.Millisecond)
	for _, l := range locks {
		require.NoError(t, l.Err())
		require.NoError(t, l.Release(ctx))
	}
	p, rn := pipelines.Load(), renewsInPipelines.Load()
	t.Logf("%d renewals in %d pipelines", rn, p)
	assert.Zero(t, single.Load(), "no renewal goes out alone")
	assert.GreaterOrEqual(t, rn, int64(n*3), "every lock was renewed several times")
	// Locks acquired within a few ms of each other share rounds: far fewer
	// round trips than renewals.
	assert.Less(t, p*5, rn)
}

type pipeCounter struct{ pipes, renews, single *atomic.Int64 }

func (h pipeCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h pipeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isRenew(cmd) {
			h.single.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h pipeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		k := int64(0)
		for _, c := range cmds {
			if isRenew(c) {
				k++
			}
		}
		if k > 0 {
			h.pipes.Add(1)
			h.renews.Add(k)
		}
		return next(ctx, cmds)
	}
}

func itoa(i int) string {
	const d = "0123456789"
	if i < 10 {
		return d[i : i+1]
	}
	return itoa(i/10) + d[i%10:i%10+1]
}

// lossTest holds a lock with lease, injects a fault for faultFor, and
// checks the loss was signalled by the local deadline, while the fault
// lasted, with ErrLockLost.
func lossTest(t *testing.T, rdb redis.UniversalClient, r *testenv.Redis, inject, heal func() error) {
	ctx := ctxT(t, 30*time.Second)
	const lease = time.Second
	rec := newRecorder()
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	c := newClient(t, r, rdb, fence.WithLease(lease), fence.WithObserver(rec), fence.WithLogger(logger))
	l, err := c.Acquire(ctx, "loss")
	require.NoError(t, err)
	rec.waitCount(t, "renewed", 1) // the deadline then derives from a renewal
	at := doneAt(l)
	faultStart := time.Now()
	require.NoError(t, inject())
	var cancelled time.Time
	select {
	case cancelled = <-at:
	case <-time.After(2500 * time.Millisecond):
	}
	// Keep the fault for 2.5 leases, so that the server expires the lock.
	time.Sleep(time.Until(faultStart.Add(2500 * time.Millisecond)))
	healed := time.Now()
	require.NoError(t, heal())
	require.False(t, cancelled.IsZero(), "lock not cancelled within 2.5 s of a fault on a 1 s lease")
	assert.ErrorIs(t, l.Err(), fence.ErrLockLost)
	deadline := l.Deadline() // last successful renewal start + lease − margin
	assert.True(t, deadline.Before(faultStart.Add(lease)), "deadline %v must derive from a renewal before the fault at %v", deadline, faultStart)
	assert.True(t, cancelled.Before(healed), "loss signalled while the fault lasted")
	late := cancelled.Sub(deadline)
	t.Logf("cancelled %v after the local deadline (negative: before); %v after the fault", late, cancelled.Sub(faultStart))
	// Typically about 1 ms before it; the slack only absorbs a loaded
	// machine's scheduling delay.
	assert.LessOrEqual(t, late, schedSlack, "cancelled after the local deadline")
	assert.Equal(t, 1, rec.count("lost"))
	assert.Contains(t, logs.String(), "fence: lock lost")
	assert.Contains(t, logs.String(), "reason=deadline", "the log line says why")
	assert.ErrorIs(t, l.Release(ctx), fence.ErrNotHeld) // expired on the server meanwhile
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logWatch is a log sink that a test waits on for a line, event-driven.
type logWatch struct {
	syncBuffer
	wrote chan struct{} // cap 1: something was written
}

func newLogWatch() *logWatch { return &logWatch{wrote: make(chan struct{}, 1)} }

func (w *logWatch) Write(p []byte) (int, error) {
	n, err := w.syncBuffer.Write(p)
	select {
	case w.wrote <- struct{}{}:
	default:
	}
	return n, err
}

// waitFor returns the first line that contains s, waiting for it (at
// most a generous minute: a bound for a hung test, not a speed check).
func (w *logWatch) waitFor(t testing.TB, s string) string {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		for line := range strings.Lines(w.String()) {
			if strings.Contains(line, s) {
				return strings.TrimSpace(line)
			}
		}
		select {
		case <-w.wrote:
		case <-deadline:
			t.Fatalf("no log line with %q; logged:\n%s", s, w.String())
		}
	}
}

func TestLossSignalledOnPause(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	lossTest(t, nil, r, r.Pause, r.Resume)
}

func TestLossSignalledOnBlackhole(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	p, rdb := proxied(t, r.Addr, redis.Options{ContextTimeoutEnabled: true})
	lossTest(t, rdb, r, func() error { p.Blackhole(); return nil }, func() error { p.Restore(); return nil })
}

func TestLossSignalledOnBlackholeDefaultTimeouts(t *testing.T) {
	t.Parallel()
	// Without ContextTimeoutEnabled the renewal round hangs until the read
	// timeout (3 s); the loss must be signalled on time all the same.
	r := testenv.NewRedisServer(t)
	p, rdb := proxied(t, r.Addr, redis.Options{})
	lossTest(t, rdb, r, func() error { p.Blackhole(); return nil }, func() error { p.Restore(); return nil })
}

func TestLossImmediateOnFlush(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 20*time.Second)
	const lease = 3 * time.Second
	c := newClient(t, r, nil, fence.WithLease(lease))
	l, err := c.Acquire(ctx, "flush")
	require.NoError(t, err)
	at := doneAt(l)
	require.NoError(t, r.Flush(ctx))
	deadlineAtFlush := l.Deadline()
	select {
	case cancelled := <-at:
		// The next renewal (≤ lease/3) found no key: lost at once, not at
		// the deadline.
		assert.True(t, cancelled.Before(deadlineAtFlush.Add(-lease/3)), "cancelled %v, deadline %v", cancelled, deadlineAtFlush)
	case <-ctx.Done():
		t.Fatal("not lost after FLUSHALL")
	}
	assert.ErrorIs(t, l.Err(), fence.ErrLockLost)
}

func TestLossImmediateOnOtherHolder(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	const lease = 3 * time.Second
	c := newClient(t, r, nil, fence.WithLease(lease))
	l, err := c.Acquire(ctx, "steal")
	require.NoError(t, err)
	at := doneAt(l)
	require.NoError(t, r.Client().SetArgs(ctx, lockKey(r, "steal"), "1:intruder", redis.SetArgs{KeepTTL: true}).Err())
	select {
	case cancelled := <-at:
		assert.True(t, cancelled.Before(l.Deadline().Add(-lease/3)))
	case <-ctx.Done():
		t.Fatal("not lost when another holder took the key")
	}
	assert.ErrorIs(t, l.Err(), fence.ErrLockLost)
	assert.ErrorIs(t, l.Release(ctx), fence.ErrNotHeld)
	h, _ := readLock(t, r.Client(), lockKey(r, "steal"))
	assert.Equal(t, "intruder", h, "release deleted nothing of the other holder")
}

func TestLossOnRestartWithoutData(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	ctx := ctxT(t, 30*time.Second)
	c := newClient(t, r, nil, fence.WithLease(time.Second))
	l, err := c.Acquire(ctx, "rst")
	require.NoError(t, err)
	require.NoError(t, r.Restart(false))
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("not lost after a restart without data")
	}
	assert.ErrorIs(t, l.Err(), fence.ErrLockLost)
	// The script cache was lost too: acquiring again reloads it, and the
	// token still increases.
	l2, err := c.Acquire(ctx, "rst")
	require.NoError(t, err)
	assert.Greater(t, l2.Token(), l.Token())
	require.NoError(t, l2.Release(ctx))
}

// Blips shorter than a renewal period (lease/3) lose nothing: a cut
// connection fails the renewal that meets it and the retry within the
// lease carries the lock; a partition and a paused server delay the
// renewal that meets them, which is answered within the lease. Each fault
// starts a little before a renewal is due, so most of a lease lies ahead
// of it, and lasts until a renewal has met it (waited for, not guessed
// with a sleep) plus a little: on a loaded machine the faults stay as short as
// they are meant to be, and each one is known to have met a renewal.
func TestBlipShorterThanRenewalLosesNothing(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	// No go-redis retries: the watchdog's own retries must carry it.
	p, rdb := proxied(t, r.Addr, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1})
	ctx := ctxT(t, 2*time.Minute)
	// The lease leaves round trips the time a loaded machine takes: under
	// the whole suite and a chaos run beside the package (a load of 10 to
	// 15 on 2 cores) round trips on an open network took 0.75 s and a
	// retry started half a second late, which used up what a 1.5 s lease
	// and then a 3 s one left after a blip (about 1 s, then 2 s). 6 s
	// leaves about 4 s.
	const lease = 6 * time.Second
	rec := newRecorder()
	c := newClient(t, r, rdb, fence.WithLease(lease), fence.WithObserver(rec))
	l, err := c.Acquire(ctx, "blip")
	require.NoError(t, err)
	start := time.Now()
	rec.mark("acquired")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("timeline:%s", rec.timeline(start))
		}
	})
	// renewed waits for the next renewal; a lost lock fails at once.
	renewed := func() {
		t.Helper()
		n := rec.count("renewed") + 1
		require.Eventually(t, func() bool { return rec.count("renewed") >= n || l.Err() != nil }, 20*time.Second, time.Millisecond)
		require.NoError(t, l.Err(), "blips shorter than lease/3 lose nothing")
	}
	// blip starts a fault (begin) a little before the next renewal is
	// due and ends it (end) once that renewal has reached the proxy, plus
	// lease/10. It returns false, the fault ended at once, when the
	// renewal had passed the proxy before the fault began (a loaded
	// machine overslept): the fault met nothing, and is tried again.
	blip := func(begin, end func()) bool {
		renewed()
		before := p.Reads()
		time.Sleep(lease / 4) // the next renewal is due lease/3 after the last one began
		begin()
		if p.Reads() > before {
			end()
			return false
		}
		require.Eventually(t, func() bool { return p.Reads() > before }, 10*time.Second, time.Millisecond, "no renewal met the fault")
		time.Sleep(lease / 10)
		end()
		return true
	}
	partition := func() { p.Blackhole(); rec.mark("blackholed") }
	heal := func() { p.Restore(); rec.mark("restored") }
	pause := func() { require.NoError(t, r.Pause()); rec.mark("paused") }
	resume := func() { require.NoError(t, r.Resume()); rec.mark("resumed") }
	for range 2 {
		// A cut fails the renewal in flight or the next one at once (the
		// proxy refuses connections): no guess needed.
		renewed()
		time.Sleep(lease / 4)
		failed := rec.count("renewalFailed")
		p.Cut()
		rec.mark("cut")
		rec.waitCount(t, "renewalFailed", failed+1)
		heal()
		for tries := 0; !blip(partition, heal); tries++ {
			require.Less(t, tries, 10, "the machine overslept every try")
		}
		for tries := 0; !blip(pause, resume); tries++ {
			require.Less(t, tries, 10, "the machine overslept every try")
		}
	}
	renewed()
	renewed()
	assert.NoError(t, l.Err(), "blips shorter than lease/3 lose nothing")
	assert.GreaterOrEqual(t, rec.count("renewalFailed"), 2, "each cut failed a renewal")
	delayed := 0
	for _, e := range all[fence.RenewEvent](rec) {
		if e.Err == nil && e.Duration >= lease/10 {
			delayed++
		}
	}
	assert.GreaterOrEqual(t, delayed, 4, "each partition and each pause delayed a renewal")
	assert.Zero(t, rec.count("lost"))
	require.NoError(t, l.Release(ctx))
}

// TestLostRenewalIsRetried loses one renewal on its way (the proxy drops
// the data while the connection stays open, as behind a host gone without
// a reset) and brings the network back at once. The attempt waiting for
// that answer must give up in time for a retry on a fresh connection to
// keep the lock: waiting until the deadline would lose a lock whose
// server was reachable all along.
func TestLostRenewalIsRetried(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	// No read timeout (-1): go-redis's default of 3 s, and the round's
	// cap of 5 s, would end an attempt sooner at a longer lease; at a
	// lease under 4.5 s with default options, or with a longer
	// ReadTimeout, the watchdog's own bound is what ends it.
	p, rdb := proxied(t, r.Addr, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1, ReadTimeout: -1})
	ctx := ctxT(t, 2*time.Minute)
	// The retry has a quarter of the lease, less retryDelay: 2.75 s. Under
	// the whole suite and make flakes beside it (a load of 10 to 15 on 2
	// cores) the timed-out read ended 0.9 s after its deadline and the
	// retry on a fresh connection took more than the 0.6 s a 6 s lease
	// left.
	const lease = 12 * time.Second
	rec := newRecorder()
	c := newClient(t, r, rdb, fence.WithLease(lease), fence.WithObserver(rec))
	l, err := c.Acquire(ctx, "dropped")
	require.NoError(t, err)
	start := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("timeline:%s", rec.timeline(start))
		}
	})
	rec.waitCount(t, "renewed", 1)
	before := p.Reads()
	p.Drop()
	rec.mark("dropping")
	require.Eventually(t, func() bool { return p.Reads() > before }, lease, time.Millisecond, "no renewal met the drop")
	p.Restore()
	rec.mark("restored")
	rec.waitCount(t, "renewalFailed", 1)
	require.Eventually(t, func() bool { return rec.count("renewed") >= 3 || l.Err() != nil }, 20*time.Second, time.Millisecond)
	require.NoError(t, l.Err(), "a lost renewal request is retried within the lease")
	assert.Zero(t, rec.count("lost"))
	failed := all[fence.RenewEvent](rec)
	var timedOut *fence.RenewEvent
	for i := range failed {
		if failed[i].Err != nil {
			timedOut = &failed[i]
			break
		}
	}
	require.NotNil(t, timedOut)
	var ne net.Error
	assert.True(t, errors.Is(timedOut.Err, context.DeadlineExceeded) || errors.As(timedOut.Err, &ne) && ne.Timeout(),
		"the lost request's attempt timed out: %v", timedOut.Err)
	// It gave up 5/12 of the lease after it began (a renewal is due a
	// third into the lease; the retry keeps the last quarter), not at
	// once and not at the deadline.
	assert.GreaterOrEqual(t, timedOut.Duration, lease/3, "the attempt waited for its answer")
	assert.Less(t, timedOut.Duration, 2*lease/3-lease/12, "the attempt gave up before the deadline")
	require.NoError(t, l.Release(ctx))
}

func TestMaxHold(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	rec := newRecorder()
	// A lease a loaded machine cannot outrun: the lock ends by its max
	// hold, not by a late renewal.
	c := newClient(t, r, nil, fence.WithLease(time.Second), fence.WithObserver(rec))
	start := time.Now()
	l, err := c.Acquire(ctx, "mh", fence.WithMaxHold(2*time.Second))
	require.NoError(t, err)
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("max hold not enforced")
	}
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Second)
	assert.ErrorIs(t, l.Err(), fence.ErrMaxHold)
	renewed := rec.count("renewed")
	assert.Positive(t, renewed, "renewed until the limit")
	// The watchdog stopped: the key expires within a lease.
	require.Eventually(t, func() bool {
		n, err := r.Client().Exists(ctx, lockKey(r, "mh")).Result()
		return err == nil && n == 0
	}, 5*time.Second, 20*time.Millisecond)
	assert.Equal(t, renewed, rec.count("renewed"))
}

// A renewal on its way when the lock ends (its max hold reached here)
// is not reported to observers once its answer comes: the loss was the
// lock's last event. The proxy delays data by 0.8 s each way once the lock
// is held, so the renewal sent a third into the 6 s lease (2 s) is
// answered (or its attempt times out, on a connection the pool opens
// through the delay) after the 3 s max hold ended the lock; a renewal due
// time overslept by up to 1 s still goes out before the loss. TestMaxHold
// met this race once in a fresh clone: one renewal more counted after the
// loss. A witness lock acquired just after it, with the same lease, is due
// within lease/12 of it and rides the same round, taken after it; a
// round's renewals are reported in the order they were taken, so the
// witness's first renewal event (renewed or failed) comes after whatever
// the round reported of the lock: the check waits for that event, not for
// a time.
func TestNoRenewalReportedAfterLoss(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedisServer(t)
	p, rdb := proxied(t, r.Addr, redis.Options{ContextTimeoutEnabled: true})
	ctx := ctxT(t, 30*time.Second)
	rec := newRecorder()
	c := newClient(t, r, rdb, fence.WithLease(6*time.Second), fence.WithObserver(rec))
	l, err := c.Acquire(ctx, "late-renewal", fence.WithMaxHold(3*time.Second))
	require.NoError(t, err)
	witness, err := c.Acquire(ctx, "late-renewal-witness")
	require.NoError(t, err)
	p.Delay(800 * time.Millisecond)
	acquired := p.Reads()
	<-l.Done()
	require.ErrorIs(t, l.Err(), fence.ErrMaxHold)
	// A renewal went out while the lock was held (nothing is sent for a
	// lock that reached its max hold); its answer comes after the loss.
	require.Eventually(t, func() bool { return p.Reads() > acquired }, time.Second, time.Millisecond,
		"no renewal was on its way at the loss: the machine overslept its due time")
	renewals := func(name string) int {
		n := 0
		for _, e := range all[fence.RenewEvent](rec) {
			if e.Name == name {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return renewals(witness.Name()) > 0 }, 20*time.Second, 5*time.Millisecond,
		"the round carrying the late renewal never ended")
	assert.Zero(t, renewals(l.Name()), "the renewal answered after the loss is not reported")
	var seq []string
	for _, e := range all[any](rec) {
		switch e := e.(type) {
		case fence.RenewEvent:
			if e.Name == l.Name() {
				seq = append(seq, "renew")
			}
		case fence.LossEvent:
			if e.Name == l.Name() {
				seq = append(seq, "loss")
			}
		}
	}
	assert.Equal(t, []string{"loss"}, seq, "the loss is the lock's last event")
}

func TestFixedLeaseAndRefresh(t *testing.T) {
	t.Parallel()
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 20*time.Second)
	c := newClient(t, r, nil)
	l, err := c.Acquire(ctx, "fx", fence.WithFixedLease(2*time.Second))
	require.NoError(t, err)
	for range 4 {
		time.Sleep(600 * time.Millisecond)
		before := l.Deadline()
		require.NoError(t, l.Refresh(ctx, 2*time.Second))
		assert.True(t, l.Deadline().After(before))
	}
	assert.NoError(t, l.Err(), "refreshed past its first lease")
	pttl, err := r.Client().PTTL(ctx, lockKey(r, "fx")).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, time.Duration(0))
	assert.LessOrEqual(t, pttl, 2*time.Second, "no watchdog extended it")
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("fixed lease not cancelled at its deadline")
	}
	assert.ErrorIs(t, l.Err(), fence.ErrLockLost)
	assert.ErrorIs(t, l.Refresh(ctx, time.Second), fence.ErrLockLost)

	w, err := c.Acquire(ctx, "wd")
	require.NoError(t, err)
	assert.ErrorIs(t, w.Refresh(ctx, time.Second), fence.ErrInvalidOption, "Refresh is for fixed-lease locks")
	require.NoError(t, w.Release(ctx))

	f, err := c.Acquire(ctx, "fx2", fence.WithFixedLease(5*time.Second))
	require.NoError(t, err)
	assert.ErrorIs(t, f.Refresh(ctx, time.Millisecond), fence.ErrInvalidOption)
	require.NoError(t, r.Client().Del(ctx, lockKey(r, "fx2")).Err())
	assert.ErrorIs(t, f.Refresh(ctx, time.Second), fence.ErrNotHeld)
	assert.ErrorIs(t, f.Err(), fence.ErrLockLost)
}

func TestGoroutinesIndependentOfLockCount(t *testing.T) {
	// Not parallel: it reads the process's goroutine count and heap.
	r := testenv.NewRedis(t)
	ctx := ctxT(t, 60*time.Second)
	rec := &renewCounter{}
	c := newClient(t, r, nil, fence.WithLease(3*time.Second), fence.WithObserver(rec))
	l0, err := c.TryAcquire(ctx, "g-first")
	require.NoError(t, err)
	base := runtime.NumGoroutine()
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	const n = 1000
	locks := make([]*fence.Lock, 0, n)
	for i := range n {
		l, err := c.TryAcquire(ctx, "g"+itoa(i))
		require.NoError(t, err)
		locks = append(locks, l)
	}
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	perLock := (int64(ms1.HeapAlloc) - int64(ms0.HeapAlloc)) / n
	t.Logf("goroutines: %d with 1 lock, %d with %d locks; heap ≈ %d B per held lock", base, runtime.NumGoroutine(), n+1, perLock)
	assert.LessOrEqual(t, runtime.NumGoroutine(), base+2, "goroutines grow with held locks")
	assert.Less(t, perLock, int64(2048))
	// One renewal round of all of them.
	require.Eventually(t, func() bool { return rec.n.Load() >= n+1 }, 20*time.Second, time.Millisecond)
	for _, l := range locks {
		require.NoError(t, l.Err())
	}
	require.NoError(t, c.Close(ctx))
	assert.ErrorIs(t, l0.Err(), fence.ErrClosed)
}

// renewCounter counts successful renewals without keeping them.
type renewCounter struct{ n atomic.Int64 }

func (c *renewCounter) OnRenew(_ context.Context, e fence.RenewEvent) {
	if e.Err == nil {
		c.n.Add(1)
	}
}
