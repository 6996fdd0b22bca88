package prequeue

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

// watchdog keeps a client's locks alive and signals their loss.
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
	kick chan struct{} // cap 1: the heap's head changed
	// wakeAt is when the scheduler's timer fires (guarded by mu): a lock
	// added with a later event needs no wake-up, the scheduler looks at the
	// heap again by then anyway. It keeps an acquire+release from waking
	// the scheduler goroutine twice.
	wakeAt time.Time

	work    chan []*Lock
	results chan roundResult
	stop    chan struct{}
	wg      sync.WaitGroup
}

type roundResult struct {
	locks []*Lock
	start time.Time
	rtt   time.Duration
	res   []int64
	other []string // the value found, when res is renewNotOurs
	errs  []error
}

func newWatchdog(c *Client) *watchdog {
	w := &watchdog{
		c:       c,
		kick:    make(chan struct{}, 1),
		work:    make(chan []*Lock),
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
// this much early: timers fire late (about 1 ms measured under -race), and
// the context must be cancelled no later than [Lock.Deadline].
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
	var pending []*Lock // due renewals not yet taken by the renewer
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
				coalesce := len(pending) > 0 && !l.fixed && !l.inflight &&
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
				pending = append(pending, l)
			}
		}
		w.wakeAt = now.Add(time.Hour)
		if len(w.h) > 0 {
			w.wakeAt = w.h[0].nextEvent()
		}
		wait := time.Until(w.wakeAt)
		w.mu.Unlock()
		for _, x := range lost {
			w.signalLoss(x.l, x.cause, now)
		}
		timer.Reset(wait)

		var work chan []*Lock
		if len(pending) > 0 {
			work = w.work
		}
		select {
		case <-w.stop:
			return
		case <-w.kick:
		case <-timer.C:
		case work <- pending:
			pending = nil
		case r := <-w.results:
			w.apply(r)
		}
	}
}

// apply records the outcome of a renewal round.
func (w *watchdog) apply(r roundResult) {
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
		var batch []*Lock
		select {
		case <-w.stop:
			return
		case batch = <-w.work:
		}
		for _, group := range w.c.byNode(batch) {
			w.wg.Add(1) // safe: this goroutine's own count is still held
			go w.renewNode(group)
		}
	}
}

// renewNode renews the locks of one node.
func (w *watchdog) renewNode(locks []*Lock) {
	defer w.wg.Done()
	for len(locks) > 0 {
		n := min(len(locks), maxBatch)
		r := w.round(locks[:n])
		locks = locks[n:]
		select {
		case w.results <- r:
		case <-w.stop:
			// Close is running: the locks are cancelled by it.
			return
		}
	}
}

// round renews locks, which live on one node, in one pipeline.
func (w *watchdog) round(locks []*Lock) roundResult {
	// Skip locks released or lost since they were queued: no renewal is
	// started for a lock after remove returned.
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
	calls := make([]scriptCall, len(locks))
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
	if len(locks) == 0 {
		return roundResult{}
	}
	// Also capped at releaseTimeout, so that Close never waits a whole
	// long lease for a round hung on a dead connection.
	if cap := time.Now().Add(releaseTimeout); cap.Before(earliest) {
		earliest = cap
	}
	ctx, cancel := context.WithDeadline(context.Background(), earliest)
	defer cancel()
	r := roundResult{locks: locks, start: time.Now(), res: make([]int64, len(locks)),
		other: make([]string, len(locks)), errs: make([]error, len(locks))}
	cmds := execScripts(ctx, w.c.rdb, renewScript, calls)
	r.rtt = time.Since(r.start)
	var failed error
	for i, cmd := range cmds {
		r.res[i], r.other[i], r.errs[i] = parseRenew(cmd)
		if r.errs[i] != nil && failed == nil {
			failed = r.errs[i]
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
