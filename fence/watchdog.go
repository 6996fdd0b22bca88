package fence

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

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
	kick chan struct{} // cap 1: a heap's head changed
	// wakeAt is when the scheduler's timer fires (guarded by mu): a lock
	// added with a later event needs no wake-up, the scheduler looks at the
	// heap again by then anyway. It keeps an acquire+release from waking
	// the scheduler goroutine twice.
	wakeAt time.Time

	work    chan batch
	results chan roundResult
	stop    chan struct{}
	wg      sync.WaitGroup
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
	}
	w.wg.Add(2)
	go w.schedule()
	go w.renew()
	return w
}

// close stops both goroutines and waits for them. A renewal round in
// flight is bounded by its context deadline (the earliest lock deadline of
// the round, at most 5 s) when the client has ContextTimeoutEnabled, else
// by the client's read timeout.
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
	if !l.maxHoldAt.IsZero() && l.maxHoldAt.Before(t) {
		t = l.maxHoldAt
	}
	if !l.fixed && !l.inflight && l.renewAt.Before(t) {
		t = l.renewAt
	}
	return t
}

func (w *watchdog) add(l *Lock) {
	w.mu.Lock()
	heap.Push(&w.h, l)
	early := l.nextEvent().Before(w.wakeAt)
	w.mu.Unlock()
	if early {
		w.poke()
	}
}

// remove unschedules l: no renewal is sent for it after remove returns.
// The scheduler is not woken: at worst its timer fires once for nothing.
func (w *watchdog) remove(l *Lock) {
	w.mu.Lock()
	if l.idx >= 0 {
		heap.Remove(&w.h, l.idx)
	}
	w.mu.Unlock()
}

// refreshed records a successful Refresh of a fixed-lease lock; false when
// the lock is no longer scheduled (lost or released meanwhile).
func (w *watchdog) refreshed(l *Lock, start time.Time, lease time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l.idx < 0 {
		return false
	}
	l.lease, l.leaseArg = lease, lease.Milliseconds()
	l.deadline.Store(start.Add(lease - driftMargin(lease)).UnixNano())
	heap.Fix(&w.h, l.idx)
	w.poke()
	return true
}

// addWaiter schedules w's heartbeats, the first at at.
func (w *watchdog) addWaiter(x *waiter, at time.Time) {
	w.mu.Lock()
	x.beatAt = at
	heap.Push(&w.wh, x)
	early := at.Before(w.wakeAt)
	w.mu.Unlock()
	if early {
		w.poke()
	}
}

// removeWaiter stops x's heartbeats: none is sent after it returns. It
// returns a channel closed when the heartbeat in flight, if any, has been
// answered; nil when none is.
func (w *watchdog) removeWaiter(x *waiter) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	x.gone = true
	if x.idx >= 0 {
		heap.Remove(&w.wh, x.idx)
	}
	if !x.inflight {
		return nil
	}
	if x.idle == nil {
		x.idle = make(chan struct{})
	}
	return x.idle
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
		case x.inflight:
			x.soon = true // when its heartbeat is answered
		case x.idx >= 0 && x.beatAt.After(now):
			x.beatAt = now
			heap.Fix(&w.wh, x.idx)
		}
	}
	w.mu.Unlock()
	w.poke()
}

// lose unschedules l and cancels it with cause.
func (w *watchdog) lose(l *Lock, cause error, now time.Time) {
	w.mu.Lock()
	scheduled := l.idx >= 0
	if scheduled {
		heap.Remove(&w.h, l.idx)
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
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var pending batch // due renewals and heartbeats not yet taken by the renewer
	var lost []loss
	for {
		now := time.Now()
		w.mu.Lock()
		lost = lost[:0]
		for len(w.h) > 0 {
			l := w.h[0]
			if ev := l.nextEvent(); ev.After(now) {
				// A renewal due within lease/12 joins a round that goes
				// out now anyway: renewing a little early costs nothing
				// and keeps the locks of a client in step, so that rounds
				// stay few and full.
				coalesce := pending.size() > 0 && !l.fixed && !l.inflight &&
					l.renewAt.Equal(ev) && !ev.After(now.Add(l.lease/12))
				if !coalesce {
					break
				}
			}
			switch {
			case !l.maxHoldAt.IsZero() && !now.Before(l.maxHoldAt):
				heap.Pop(&w.h)
				lost = append(lost, loss{l, ErrMaxHold})
			case !now.Before(l.lossAt()):
				heap.Pop(&w.h)
				lost = append(lost, loss{l, l.deadlineLoss()})
			default: // renewal due
				l.inflight = true
				heap.Fix(&w.h, 0)
				pending.locks = append(pending.locks, l)
			}
		}
		for len(w.wh) > 0 {
			x := w.wh[0]
			// Heartbeats due within liveness/12 join a round that goes out
			// anyway, as renewals do.
			if x.beatAt.After(now) && (pending.size() == 0 || x.beatAt.After(now.Add(x.cfg.liveness/12))) {
				break
			}
			heap.Pop(&w.wh) // rescheduled when answered
			x.inflight = true
			pending.waiters = append(pending.waiters, x)
		}
		w.wakeAt = now.Add(time.Hour)
		if len(w.h) > 0 {
			w.wakeAt = w.h[0].nextEvent()
		}
		if len(w.wh) > 0 && w.wh[0].beatAt.Before(w.wakeAt) {
			w.wakeAt = w.wh[0].beatAt
		}
		wait := time.Until(w.wakeAt)
		w.mu.Unlock()
		for _, x := range lost {
			w.signalLoss(x.l, x.cause, now)
		}
		timer.Reset(wait)

		var work chan batch
		if pending.size() > 0 {
			work = w.work
		}
		select {
		case <-w.stop:
			w.dropBeats(pending.waiters)
			return
		case <-w.kick:
		case <-timer.C:
		case work <- pending:
			pending = batch{}
		case r := <-w.results:
			w.apply(r)
		}
	}
}

func (b batch) size() int { return len(b.locks) + len(b.waiters) }

// apply records the outcome of a renewal round.
func (w *watchdog) apply(r roundResult) {
	w.applyBeats(r)
	now := time.Now()
	var lost []loss
	w.mu.Lock()
	for i, l := range r.locks {
		l.inflight = false
		if l.idx < 0 {
			continue // released or lost meanwhile
		}
		switch {
		case r.errs[i] != nil:
			// Transient: retry soon, within what is left of the lease.
			l.renewErr = r.errs[i]
			l.renewAt = now.Add(retryDelay(l.lease))
			heap.Fix(&w.h, l.idx)
		case r.res[i] == renewOK:
			l.renewErr = nil
			l.setDeadlineFrom(r.start, l.lease)
			l.renewAt = r.start.Add(l.lease / 3)
			heap.Fix(&w.h, l.idx)
		default: // gone or another holder: terminal at once
			heap.Remove(&w.h, l.idx)
			lost = append(lost, loss{l, l.renewLoss(r.res[i], r.other[i])})
		}
	}
	w.mu.Unlock()
	if len(w.c.obs.renew) > 0 {
		for i, l := range r.locks {
			if r.errs[i] != nil || r.res[i] == renewOK {
				w.c.obs.onRenew(l.vctx, RenewEvent{Name: l.name, Token: l.token, Duration: r.rtt, Deadline: l.Deadline(), Err: r.errs[i]})
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
		x.inflight = false
		if x.idle != nil {
			close(x.idle)
			x.idle = nil
		}
		if x.gone {
			continue
		}
		x.beatAt = next[i]
		if x.soon {
			x.soon, x.beatAt = false, minTime(x.beatAt, time.Now())
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
		x.inflight = false
		if x.idle != nil {
			close(x.idle)
			x.idle = nil
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
	// Skip locks released or lost since they were queued: no renewal is
	// started for a lock after remove returned. A waiter that left is
	// still sent (its leave waits for the answer): the answer is ignored.
	w.mu.Lock()
	kept := locks[:0]
	for _, l := range locks {
		if l.idx >= 0 {
			kept = append(kept, l)
		} else {
			l.inflight = false
		}
	}
	locks = kept
	calls := make([]scriptCall, len(locks), len(locks)+len(waiters))
	// The round may not outlive the earliest deadline in it: past that the
	// scheduler has declared the lock lost anyway.
	var earliest time.Time
	for i, l := range locks {
		calls[i] = l.renewCall(l.leaseArg)
		if d := time.Unix(0, l.deadline.Load()); i == 0 || d.Before(earliest) {
			earliest = d
		}
	}
	w.mu.Unlock()
	for _, x := range waiters {
		calls = append(calls, x.beatCall())
	}
	if len(calls) == 0 {
		return roundResult{}
	}
	// Also capped at releaseTimeout, so that Close never waits a whole
	// long lease for a round hung on a dead connection (and heartbeats
	// alone are bounded by it).
	if cap := time.Now().Add(releaseTimeout); len(locks) == 0 || cap.Before(earliest) {
		earliest = cap
	}
	ctx, cancel := context.WithDeadline(context.Background(), earliest)
	defer cancel()
	r := roundResult{locks: locks, start: time.Now(), res: make([]int64, len(locks)),
		other: make([]string, len(locks)), errs: make([]error, len(locks)),
		waiters: waiters, beats: make([]acquireReply, len(waiters)), beatErr: make([]error, len(waiters))}
	cmds := execScripts(ctx, w.c.rdb, renewScript, calls, w.c.route())
	r.rtt = time.Since(r.start)
	var failed error
	for i, cmd := range cmds {
		var err error
		if i < len(locks) {
			r.res[i], r.other[i], r.errs[i] = parseRenew(cmd)
			err = r.errs[i]
		} else {
			j := i - len(locks)
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
	if failed != nil {
		// A failover or a moved slot: have go-redis look again now,
		// so that the retry goes to the new master.
		w.c.refreshTopology(failed)
	}
	return r
}

// lockHeap orders locks by their next event.
type lockHeap []*Lock

func (h lockHeap) Len() int           { return len(h) }
func (h lockHeap) Less(i, j int) bool { return h[i].nextEvent().Before(h[j].nextEvent()) }
func (h lockHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *lockHeap) Push(x any) {
	l := x.(*Lock)
	l.idx = len(*h)
	*h = append(*h, l)
}
func (h *lockHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.idx = -1
	return l
}

// waiterHeap orders waiters by their next heartbeat.
type waiterHeap []*waiter

func (h waiterHeap) Len() int           { return len(h) }
func (h waiterHeap) Less(i, j int) bool { return h[i].beatAt.Before(h[j].beatAt) }
func (h waiterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *waiterHeap) Push(x any) {
	w := x.(*waiter)
	w.idx = len(*h)
	*h = append(*h, w)
}
func (h *waiterHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.idx = -1
	return w
}
