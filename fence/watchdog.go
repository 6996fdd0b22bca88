package fence

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Locks. watchdog.mu guards the two heaps, wakeAt and the timer, and the
// part of each scheduled lock and waiter that the watchdog owns: a Lock's
// lockSched and a waiter's beatSched, which no other code reads or writes
// (adopt fills a lock's before the lock is scheduled). In the package's lock
// order (see client.go) it is a leaf: taken with Client.mu held (adopt,
// Close) or with no mutex held, and nothing under it takes another
// mutex: a waiter's heartbeat call and answer (beatCall, answered: the
// waiter's mutex, the notifier's) and the losses it finds (the client's
// mutex, the observers) are handled after unlocking.

// maxBatch caps the renewals sent in one pipeline. Rounds of up to 10,000
// locks go out as one pipeline: batches are sent one after another, each
// waiting for the previous one's replies and its bookkeeping, so more
// batches cost round trips and wake-ups for nothing; 10,000 renewals are
// about 1 MB of commands, which the server reads in 16 KB chunks between
// other clients' commands.
const maxBatch = 10000

// watchdog keeps a client's locks alive and signals their loss, and
// sends its waiters' heartbeats (see wait.go) in the same rounds: 10,000
// waiters cost the round trips of 10,000 locks.
//
// It is two goroutines per client, however many locks are held:
//   - the scheduler owns a min-heap of locks ordered by their next event
//     (renewal due, local deadline, max-hold limit) and one timer for the
//     earliest; it cancels lost locks itself, so a loss is signalled on time
//     even while a renewal round hangs on a dead connection;
//   - the renewer hands the due renewals to one goroutine per node, which
//     sends them in one pipeline (one round trip per node) and hands the
//     outcome back as soon as its node answered: one node's trouble delays
//     no other node's renewals.
type watchdog struct {
	c *Client

	mu   sync.Mutex
	h    lockHeap
	wh   waiterHeap    // waiters by their next heartbeat
	kick chan struct{} // cap 1: look at the heaps now
	// timer wakes the scheduler at wakeAt, the earliest event it knows
	// of. Both change under mu only. An added lock or waiter with an
	// earlier first event moves the timer rather than waking the
	// scheduler: its first event is a renewal or heartbeat a third of a
	// lease away, and a lock released before then (most are) costs the
	// scheduler goroutine nothing.
	timer  *time.Timer
	wakeAt time.Time
	turns  atomic.Int64 // of the scheduler's loop (its tests count them)

	work    chan batch
	results chan roundResult
	stop    chan struct{}
	wg      sync.WaitGroup
}

// lockSched is the watchdog's part of a Lock: the schedule of its
// renewals. Guarded by watchdog.mu.
type lockSched struct {
	lease     time.Duration
	leaseArg  any // lease in ms, boxed once per lease
	renewAt   time.Time
	maxHoldAt time.Time // zero: no limit
	inflight  bool      // a renewal is on its way
	idx       int       // index in the watchdog's lock heap, -1 when not scheduled
	renewErr  error     // the last renewal's error, nil after a success
}

// beatSched is the watchdog's part of a waiter: the schedule of its
// heartbeats. Guarded by watchdog.mu.
type beatSched struct {
	beatAt   time.Time
	inflight bool          // a heartbeat is on its way
	idx      int           // index in the watchdog's waiter heap, -1 when not scheduled
	soon     bool          // heartbeat again as soon as the one in flight is answered
	gone     bool          // removed: no heartbeat after the one in flight
	idle     chan struct{} // closed when an in-flight heartbeat is answered, for leave
}

// batch is the work of one round: renewals and heartbeats.
type batch struct {
	locks   []*Lock
	waiters []*waiter
}

type roundResult struct {
	locks []*Lock
	start time.Time
	rtt   time.Duration
	res   []int64
	other []string // the value found, when res is renewNotOurs
	errs  []error
	// The heartbeats of the round: each waiter's answer or error.
	waiters []*waiter
	beats   []acquireReply
	beatErr []error
}

func newWatchdog(c *Client) *watchdog {
	w := &watchdog{
		c:       c,
		kick:    make(chan struct{}, 1),
		work:    make(chan batch),
		results: make(chan roundResult),
		stop:    make(chan struct{}),
		timer:   time.NewTimer(time.Hour),
	}
	w.wakeAt = time.Now().Add(time.Hour)
	w.wg.Add(2)
	go w.schedule()
	go w.renew()
	return w
}

// close stops both goroutines and waits for them. A renewal round in
// flight is bounded by its context deadline (see renewAttemptEnd; at most
// 5 s) when the client has ContextTimeoutEnabled, else by the client's
// read timeout.
func (w *watchdog) close() {
	close(w.stop)
	w.wg.Wait()
}

// lossLead makes the scheduler's timer for a lock's local deadline fire
// this much early: a timer fires after its time, later still on a loaded
// machine or under the race detector, and the context must be cancelled
// no later than [Lock.Deadline].
const lossLead = 2 * time.Millisecond

// lossAt is when the scheduler declares l lost if no renewal succeeded.
func (l *Lock) lossAt() time.Time { return time.Unix(0, l.deadline.Load()).Add(-lossLead) }

// nextEvent is when the scheduler must look at l next.
func (l *Lock) nextEvent() time.Time {
	t := l.lossAt()
	if !l.sched.maxHoldAt.IsZero() && l.sched.maxHoldAt.Before(t) {
		t = l.sched.maxHoldAt
	}
	if !l.fixed && !l.sched.inflight && l.sched.renewAt.Before(t) {
		t = l.sched.renewAt
	}
	return t
}

func (w *watchdog) add(l *Lock) {
	w.mu.Lock()
	heap.Push(&w.h, l)
	w.wakeByLocked(l.nextEvent())
	w.mu.Unlock()
}

// wakeByLocked makes the scheduler's timer fire no later than at.
// Called with w.mu held.
func (w *watchdog) wakeByLocked(at time.Time) {
	if at.Before(w.wakeAt) {
		w.wakeAt = at
		w.timer.Reset(time.Until(at))
	}
}

// remove unschedules l: no renewal is sent for it after remove returns.
// The scheduler is not woken: at worst its timer fires once for nothing.
func (w *watchdog) remove(l *Lock) {
	w.mu.Lock()
	if l.sched.idx >= 0 {
		heap.Remove(&w.h, l.sched.idx)
	}
	w.mu.Unlock()
}

// refreshed records a successful Refresh of a fixed-lease lock; false when
// the lock is no longer scheduled (lost or released meanwhile).
func (w *watchdog) refreshed(l *Lock, start time.Time, lease time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l.sched.idx < 0 {
		return false
	}
	l.sched.lease, l.sched.leaseArg = lease, lease.Milliseconds()
	l.deadline.Store(start.Add(lease - driftMargin(lease)).UnixNano())
	heap.Fix(&w.h, l.sched.idx)
	w.poke()
	return true
}

// addWaiter schedules w's heartbeats, the first at at.
func (w *watchdog) addWaiter(x *waiter, at time.Time) {
	w.mu.Lock()
	x.sched.beatAt = at
	heap.Push(&w.wh, x)
	w.wakeByLocked(at)
	w.mu.Unlock()
}

// removeWaiter stops x's heartbeats: none is sent after it returns. It
// returns a channel closed when the heartbeat in flight, if any, has been
// answered; nil when none is.
func (w *watchdog) removeWaiter(x *waiter) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	x.sched.gone = true
	if x.sched.idx >= 0 {
		heap.Remove(&w.wh, x.sched.idx)
	}
	if !x.sched.inflight {
		return nil
	}
	if x.sched.idle == nil {
		x.sched.idle = make(chan struct{})
	}
	return x.sched.idle
}

// beatSoon makes the scheduled waiters among xs heartbeat now (a message
// may have been missed, or the lock may be free).
func (w *watchdog) beatSoon(xs ...*waiter) {
	if len(xs) == 0 {
		return
	}
	now := time.Now()
	w.mu.Lock()
	for _, x := range xs {
		switch {
		case x == nil:
		case x.sched.inflight:
			x.sched.soon = true // when its heartbeat is answered
		case x.sched.idx >= 0 && x.sched.beatAt.After(now):
			x.sched.beatAt = now
			heap.Fix(&w.wh, x.sched.idx)
		}
	}
	w.mu.Unlock()
	w.poke()
}

// lose unschedules l and cancels it with cause.
func (w *watchdog) lose(l *Lock, cause error, now time.Time) {
	w.mu.Lock()
	scheduled := l.sched.idx >= 0
	if scheduled {
		heap.Remove(&w.h, l.sched.idx)
	}
	w.mu.Unlock()
	if scheduled {
		w.signalLoss(l, cause, now)
	}
}

func (w *watchdog) signalLoss(l *Lock, cause error, now time.Time) { w.c.lost(l, cause, now) }

func (w *watchdog) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

type loss struct {
	l     *Lock
	cause error
}

func (w *watchdog) schedule() {
	defer w.wg.Done()
	defer w.timer.Stop()
	var pending batch // due renewals and heartbeats not yet taken by the renewer
	var lost []loss
	for {
		w.turns.Add(1)
		now := time.Now()
		w.mu.Lock()
		lost = w.takeLocks(now, &pending, lost[:0])
		w.takeBeats(now, &pending)
		w.nextWakeLocked(now)
		w.mu.Unlock()
		for _, x := range lost {
			w.signalLoss(x.l, x.cause, now)
		}
		// The slice is kept for the next round: what it held must not
		// keep the lost locks (and their keys, contexts and errors) alive
		// until a later round overwrites them.
		clear(lost)

		var work chan batch
		if pending.size() > 0 {
			work = w.work
		}
		select {
		case <-w.stop:
			w.dropBeats(pending.waiters)
			return
		case <-w.kick:
		case <-w.timer.C:
		case work <- pending:
			pending = batch{}
		case r := <-w.results:
			w.apply(r)
		}
	}
}

// takeLocks moves the locks whose renewal is due at now into pending, and
// those past their deadline or their maximum hold into lost. Called with
// w.mu held.
func (w *watchdog) takeLocks(now time.Time, pending *batch, lost []loss) []loss {
	for len(w.h) > 0 {
		l := w.h[0]
		if ev := l.nextEvent(); ev.After(now) {
			// A renewal due within lease/12 joins a round that goes
			// out now anyway: renewing a little early costs nothing
			// and keeps the locks of a client in step, so that rounds
			// stay few and full.
			coalesce := pending.size() > 0 && !l.fixed && !l.sched.inflight &&
				l.sched.renewAt.Equal(ev) && !ev.After(now.Add(l.sched.lease/12))
			if !coalesce {
				break
			}
		}
		switch {
		case !l.sched.maxHoldAt.IsZero() && !now.Before(l.sched.maxHoldAt):
			heap.Pop(&w.h)
			lost = append(lost, loss{l, ErrMaxHold})
		case !now.Before(l.lossAt()):
			heap.Pop(&w.h)
			lost = append(lost, loss{l, l.deadlineLoss()})
		default: // renewal due
			l.sched.inflight = true
			heap.Fix(&w.h, 0)
			pending.locks = append(pending.locks, l)
		}
	}
	return lost
}

// takeBeats moves the waiters whose heartbeat is due at now into pending.
// Called with w.mu held.
func (w *watchdog) takeBeats(now time.Time, pending *batch) {
	for len(w.wh) > 0 {
		x := w.wh[0]
		// Heartbeats due within liveness/12 join a round that goes out
		// anyway, as renewals do.
		if x.sched.beatAt.After(now) && (pending.size() == 0 || x.sched.beatAt.After(now.Add(x.cfg.liveness/12))) {
			break
		}
		heap.Pop(&w.wh) // rescheduled when answered
		x.sched.inflight = true
		pending.waiters = append(pending.waiters, x)
	}
}

// nextWakeLocked sets wakeAt to the heaps' earliest event (an hour away
// when both are empty), and the timer to fire then. Called with w.mu
// held.
func (w *watchdog) nextWakeLocked(now time.Time) {
	w.wakeAt = now.Add(time.Hour)
	if len(w.h) > 0 {
		w.wakeAt = w.h[0].nextEvent()
	}
	if len(w.wh) > 0 && w.wh[0].sched.beatAt.Before(w.wakeAt) {
		w.wakeAt = w.wh[0].sched.beatAt
	}
	w.timer.Reset(time.Until(w.wakeAt))
}

func (b batch) size() int { return len(b.locks) + len(b.waiters) }

// apply records the outcome of a renewal round. Observers hear of the
// renewals of the locks still scheduled only: a lock released or lost
// while its renewal was on its way has had its last event (OnRelease,
// OnLoss), and a renewal reported after it would read as a lock alive.
func (w *watchdog) apply(r roundResult) {
	w.applyBeats(r)
	now := time.Now()
	var lost []loss
	var live []bool // with renewal observers: r.locks[i] was still scheduled
	if len(w.c.obs.renew) > 0 {
		live = make([]bool, len(r.locks))
	}
	w.mu.Lock()
	for i, l := range r.locks {
		l.sched.inflight = false
		if l.sched.idx < 0 {
			continue // released or lost meanwhile
		}
		if live != nil {
			live[i] = true
		}
		switch {
		case r.errs[i] != nil:
			// Transient: retry soon, within what is left of the lease.
			l.sched.renewErr = r.errs[i]
			l.sched.renewAt = now.Add(retryDelay(l.sched.lease))
			heap.Fix(&w.h, l.sched.idx)
		case r.res[i] == renewOK:
			l.sched.renewErr = nil
			l.setDeadlineFrom(r.start, l.sched.lease)
			l.sched.renewAt = r.start.Add(l.sched.lease / 3)
			heap.Fix(&w.h, l.sched.idx)
		default: // gone or another holder: terminal at once
			heap.Remove(&w.h, l.sched.idx)
			lost = append(lost, loss{l, l.renewLoss(r.res[i], r.other[i])})
		}
	}
	w.mu.Unlock()
	if live != nil {
		for i, l := range r.locks {
			if live[i] && (r.errs[i] != nil || r.res[i] == renewOK) {
				w.c.obs.onRenew(l.values(), RenewEvent{Name: l.name, Token: l.token, Duration: r.rtt, Deadline: l.Deadline(), Err: r.errs[i]})
			}
		}
	}
	for _, x := range lost {
		w.signalLoss(x.l, x.cause, now)
	}
}

// applyBeats hands each waiter its heartbeat's answer, and schedules its
// next heartbeat unless it left meanwhile.
func (w *watchdog) applyBeats(r roundResult) {
	if len(r.waiters) == 0 {
		return
	}
	next := make([]time.Time, len(r.waiters))
	for i, x := range r.waiters {
		next[i] = x.answered(r.beats[i], r.start, r.beatErr[i]) // not under w.mu: it takes the waiter's and the notifier's
	}
	w.mu.Lock()
	for i, x := range r.waiters {
		x.sched.inflight = false
		if x.sched.idle != nil {
			close(x.sched.idle)
			x.sched.idle = nil
		}
		if x.sched.gone {
			continue
		}
		x.sched.beatAt = next[i]
		if x.sched.soon {
			x.sched.soon, x.sched.beatAt = false, minTime(x.sched.beatAt, time.Now())
		}
		heap.Push(&w.wh, x)
	}
	w.mu.Unlock()
}

// dropBeats ends the heartbeats of xs that will never be answered (the
// watchdog stops): a leave that waits for one goes on at once.
func (w *watchdog) dropBeats(xs []*waiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range xs {
		x.sched.inflight = false
		if x.sched.idle != nil {
			close(x.sched.idle)
			x.sched.idle = nil
		}
	}
}

// retryDelay spaces retries of a failed renewal: several fit in the lease,
// and at most maxRetryDelay passes between them, so that renewals resume
// soon after a failover ends.
func retryDelay(lease time.Duration) time.Duration {
	return min(max(lease/20, 10*time.Millisecond), maxRetryDelay)
}

// maxRetryDelay caps the wait between retries of a failed renewal.
const maxRetryDelay = 250 * time.Millisecond

// renew dispatches the renewal rounds handed over by the scheduler: one
// goroutine per node, each sending its node's renewals in one pipeline
// (batches of maxBatch, one after another) and handing back each result
// as soon as that node answered. A stalled or dead node then delays the
// outcome of its own locks only: the others' results are applied while its
// round still hangs, and the scheduler cancels its locks at their
// deadlines. Those locks stay in flight (not re-sent) until their round
// ends, so a hung node has at most one round per lock outstanding.
func (w *watchdog) renew() {
	defer w.wg.Done()
	for {
		var b batch
		select {
		case <-w.stop:
			return
		case b = <-w.work:
		}
		for _, group := range w.c.byNode(b) {
			w.wg.Add(1) // safe: this goroutine's own count is still held
			go w.renewNode(group)
		}
	}
}

// renewNode renews the locks and sends the heartbeats of one node.
func (w *watchdog) renewNode(b batch) {
	defer w.wg.Done()
	for b.size() > 0 {
		nl := min(len(b.locks), maxBatch)
		nw := min(len(b.waiters), maxBatch-nl)
		r := w.round(b.locks[:nl], b.waiters[:nw])
		b.locks, b.waiters = b.locks[nl:], b.waiters[nw:]
		select {
		case w.results <- r:
		case <-w.stop:
			// Close is running: the locks are cancelled by it, the
			// waiters end with it.
			w.dropBeats(r.waiters)
			w.dropBeats(b.waiters)
			return
		}
	}
}

// round renews locks and sends the heartbeats of waiters, which live on
// one node, in one pipeline.
func (w *watchdog) round(locks []*Lock, waiters []*waiter) roundResult {
	locks, calls, end := w.renewCalls(locks, len(waiters))
	for _, x := range waiters {
		calls = append(calls, x.beatCall())
	}
	if len(calls) == 0 {
		return roundResult{}
	}
	// Also capped at releaseTimeout, so that Close never waits a whole
	// long lease for a round hung on a dead connection (and heartbeats
	// alone are bounded by it).
	if cap := time.Now().Add(releaseTimeout); len(locks) == 0 || cap.Before(end) {
		end = cap
	}
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	r := roundResult{locks: locks, start: time.Now(), res: make([]int64, len(locks)),
		other: make([]string, len(locks)), errs: make([]error, len(locks)),
		waiters: waiters, beats: make([]acquireReply, len(waiters)), beatErr: make([]error, len(waiters))}
	cmds := execScripts(ctx, w.c.rdb, renewScript, calls, w.c.route())
	r.rtt = time.Since(r.start)
	if failed := r.parse(cmds); failed != nil {
		// A failover or a moved slot: have go-redis look again now,
		// so that the retry goes to the new master.
		w.c.refreshTopology(failed)
	}
	return r
}

// renewCalls drops from locks those released or lost since they were
// queued (no renewal is started for a lock after remove returned), and
// returns the rest with their renewal calls (room left for extra more)
// and when the round's attempt ends (see renewAttemptEnd). A waiter that
// left is still sent (its leave waits for the answer): the answer is
// ignored.
func (w *watchdog) renewCalls(locks []*Lock, extra int) ([]*Lock, []scriptCall, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	kept := locks[:0]
	for _, l := range locks {
		if l.sched.idx >= 0 {
			kept = append(kept, l)
		} else {
			l.sched.inflight = false
		}
	}
	calls := make([]scriptCall, len(kept), len(kept)+extra)
	var earliest time.Time
	var shortest time.Duration
	for i, l := range kept {
		calls[i] = l.renewCall(l.sched.leaseArg)
		if d := time.Unix(0, l.deadline.Load()); i == 0 || d.Before(earliest) {
			earliest = d
		}
		if i == 0 || l.sched.lease < shortest {
			shortest = l.sched.lease
		}
	}
	return kept, calls, renewAttemptEnd(time.Now(), earliest, shortest)
}

// renewAttemptEnd is when a renewal attempt started at now gives up: a
// quarter of the shortest lease among its locks before the earliest of
// their deadlines, so that a retry still fits, or at that deadline when
// less than half the lease is left (a retry gets all of it). Past the
// deadline the scheduler has declared the lock lost anyway.
//
// Giving up before the deadline matters when a request is lost rather
// than late (a connection dropped without a reset, a host gone): its
// answer never comes, and an attempt that waited for it until the
// deadline would lose a lock whose server is reachable again a moment
// later. go-redis drops a connection whose read timed out, so the retry
// (retryDelay later) goes out on a fresh one. Renewals are idempotent:
// retrying one that did arrive costs a round trip. A server merely slow
// keeps 5/12 of the lease per attempt (from a renewal due a third into
// the lease). The bound takes effect through the context's deadline, so
// only with ContextTimeoutEnabled; the client's ReadTimeout and
// releaseTimeout (see round) end an attempt sooner when shorter.
func renewAttemptEnd(now, earliest time.Time, shortest time.Duration) time.Time {
	if reserve := shortest / 4; earliest.Sub(now) > 2*reserve {
		return earliest.Add(-reserve)
	}
	return earliest
}

// parse fills r from the round's replies (its renewals first, then its
// heartbeats) and returns the first error met.
func (r *roundResult) parse(cmds []*redis.Cmd) (failed error) {
	for i, cmd := range cmds {
		var err error
		if i < len(r.locks) {
			r.res[i], r.other[i], r.errs[i] = parseRenew(cmd)
			err = r.errs[i]
		} else {
			j := i - len(r.locks)
			var v any
			if v, err = cmd.Result(); err == nil {
				r.beats[j], err = parseAcquire(v)
			}
			r.beatErr[j] = err
		}
		if err != nil && failed == nil {
			failed = err
		}
	}
	return failed
}

// lockHeap orders locks by their next event.
type lockHeap []*Lock

func (h lockHeap) Len() int           { return len(h) }
func (h lockHeap) Less(i, j int) bool { return h[i].nextEvent().Before(h[j].nextEvent()) }
func (h lockHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].sched.idx, h[j].sched.idx = i, j
}
func (h *lockHeap) Push(x any) {
	l := x.(*Lock)
	l.sched.idx = len(*h)
	*h = append(*h, l)
}
func (h *lockHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.sched.idx = -1
	return l
}

// waiterHeap orders waiters by their next heartbeat.
type waiterHeap []*waiter

func (h waiterHeap) Len() int           { return len(h) }
func (h waiterHeap) Less(i, j int) bool { return h[i].sched.beatAt.Before(h[j].sched.beatAt) }
func (h waiterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].sched.idx, h[j].sched.idx = i, j
}
func (h *waiterHeap) Push(x any) {
	w := x.(*waiter)
	w.sched.idx = len(*h)
	*h = append(*h, w)
}
func (h *waiterHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.sched.idx = -1
	return w
}
