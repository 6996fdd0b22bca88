package fence

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fencelock/fencelock/testenv"
)

// BenchmarkRenewRound: one watchdog renewal round of 1,000 held locks (one
// pipelined round trip).
func BenchmarkRenewRound(b *testing.B) {
	r := testenv.NewRedis(b)
	ctx := context.Background()
	c, err := New(r.Client(), WithPrefix(r.Prefix+"fence:"), WithLease(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(ctx)
	const n = 1000
	locks := make([]*Lock, n)
	for i := range locks {
		if locks[i], err = c.TryAcquire(ctx, "r"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res := c.wd.round(append([]*Lock(nil), locks...), nil)
		for i, e := range res.errs {
			if e != nil || res.res[i] != renewOK {
				b.Fatalf("renewal %d: %v %d", i, e, res.res[i])
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/lock")
}

// A heartbeat of a waiter that reaches Redis after the waiter was handed
// the lock (sent before the handover, by a waiter that may have died
// since) extends the lock to the waiter's grant lease only, not to its
// whole lease, and never shortens a lease its holder renewed: a dead
// waiter costs the queue a liveness. Before, such a heartbeat restarted
// the whole lease (TestWaiterCrash/granted met it under load: the lock
// moved on 8.9 s after the handover, with a 1 s liveness).
func TestLateHeartbeatExtendsToGrantLeaseOnly(t *testing.T) {
	r := testenv.NewRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := New(r.Client(), WithPrefix(r.Prefix+"fence:"), WithLease(30*time.Second), WithLiveness(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	const name = "late-beat"
	held, err := c.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := c.lockConfig(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := keysFor(cfg.prefix, name)
	// "dying" joins the queue (its first call), as a waiter's Acquire does.
	if _, rep, err := c.attempt(ctx, name, k, &cfg, "dying", modeWait, time.Now()); err != nil || !rep.queued {
		t.Fatalf("dying did not queue: %v %+v", err, rep)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	pttl := func() time.Duration {
		d, err := r.Client().PTTL(ctx, k.lock).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if got := pttl(); got <= 0 || got > time.Second {
		t.Fatalf("the handover's grant lease: pttl %v, want (0, 1s]", got)
	}
	// The late heartbeat finds the handover.
	l, _, err := c.attempt(ctx, name, k, &cfg, "dying", modeBeat, time.Now())
	if err != nil || l == nil {
		t.Fatalf("the heartbeat found no handover: %v", err)
	}
	if got := pttl(); got <= 0 || got > time.Second {
		t.Errorf("a late heartbeat extended the handover to %v; want at most the 1s grant lease", got)
	}
	// A heartbeat arriving after the holder renewed to its whole lease
	// leaves that lease alone.
	if err := r.Client().PExpire(ctx, k.lock, 30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.attempt(ctx, name, k, &cfg, "dying", modeBeat, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := pttl(); got < 29*time.Second {
		t.Errorf("a late heartbeat shortened a renewed lease to %v", got)
	}
	_ = l.Release(ctx)
}

// An acquisition moves the scheduler's timer to its lock's first renewal
// instead of waking the scheduler: a lock released before then (most
// are) costs the scheduler goroutine nothing. Before, every acquisition
// that found the heap empty woke it, one turn of its loop per
// acquire+release.
func TestAcquireDoesNotWakeScheduler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newTestClient(t, testenv.NewRedis(t))
	const n = 100
	// The scheduler's first turn, at its start, is not the loop's.
	for c.wd.turns.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	before := c.wd.turns.Load()
	for range n {
		l, err := c.Acquire(ctx, "quiet")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The first lock's renewal is DefaultLease/3 away: no turn is due
	// within the loop. One is allowed for a turn already under way.
	if turns := c.wd.turns.Load() - before; turns > 1 {
		t.Errorf("%d acquire+release woke the scheduler %d times; want at most 1", n, turns)
	}
}

// A lock whose first renewal comes before every event the scheduler's
// timer was set for moves the timer: a short lease acquired beside a long
// one is renewed on time, with the scheduler asleep until then.
func TestShortLeaseMovesTimer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newTestClient(t, testenv.NewRedis(t))
	long, err := c.Acquire(ctx, "long", WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer long.Release(ctx)
	// Let the scheduler settle on the long lock's renewal, 20 s away.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.wd.mu.Lock()
		settled := time.Until(c.wd.wakeAt) > 10*time.Second && len(c.wd.kick) == 0
		c.wd.mu.Unlock()
		if settled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the scheduler did not settle on the long lock's renewal")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Renewals every lease/3: one may be a lease late on a loaded
	// machine (as in TestWatchdogKeepsLockAlive) before the lock is lost.
	const lease = 1500 * time.Millisecond
	short, err := c.Acquire(ctx, "short", WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	first := short.Deadline()
	time.Sleep(4 * lease)
	if err := short.Err(); err != nil {
		t.Fatalf("the short lock ended: %v", err)
	}
	if !short.Deadline().After(first) {
		t.Error("the short lock was never renewed")
	}
	if err := short.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
