package fence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Locks. waiter.mu guards a waiter's outcome and what the last answer
// said (the fields below it); it is taken with no other mutex held, and
// takes none (see client.go for the order). The waiter's heartbeat
// schedule is the watchdog's (beatSched, under watchdog.mu).

// The wait for a held lock (Acquire after its first attempt): the waiter
// is in the name's queue in Redis (see queue.lua), in arrival order among
// every process. Its place is kept by heartbeats — acquire.lua in 'b'
// mode — that the watchdog sends with the renewals, one pipeline per node
// per period, every liveness/3; one whose process dies is skipped once
// its deadline passes. The lock reaches it by one of:
//   - a handover: the holder's release makes it the holder in the same
//     script and publishes a grant, which the notifier hands to it (or
//     the release was this client's own: handedTo, without a message);
//   - a heartbeat that finds the lock handed to it (the message was lost,
//     or the Redis user may not PUBLISH) or free with it at the head (the
//     last holder's lease ran out, or a version without handover
//     released it): this client's first waiter of a name heartbeats at
//     the holder's expiry too, and at once on a release message.
// The Acquire goroutine only waits for the outcome (run); the network
// calls go through the watchdog, the notifier's goroutines, and one
// leave per waiter that ends without the lock.

// waiter is one Acquire call waiting in a lock's queue.
type waiter struct {
	c      *Client
	name   string
	k      keys
	cfg    config
	holder string
	until  string        // what ends the wait, as the outage warning says it
	wake   chan struct{} // cap 1: the outcome changed

	mu    sync.Mutex
	state waitState
	// value, start, px and reacq describe the lock once granted: its value,
	// the local time its lease counts from, and that lease (a handover's
	// may be shorter than cfg.lease, see grantLease).
	value    string
	start    time.Time
	px       time.Duration
	reacq    bool
	fatal    error         // failed: the Redis error that ends the wait
	lastErr  error         // the last transient error, nil after an answer
	errSince time.Time     // when the calls began to fail (the first of the errors since the last answer)
	backoff  time.Duration // the pause before the next call after a transient error
	pttl     int64         // the holder's remaining lease in the last answer
	joined   bool          // in the queue, as far as the last answer says
	// syncAt and syncSrv date a handover message: the last answered call
	// was sent at syncAt and ran at syncSrv (server µs), so the handover
	// at server time t happened no earlier than syncAt + (t - syncSrv).
	syncAt  time.Time
	syncSrv int64

	// sched is the watchdog's: its schedule of the waiter's heartbeats,
	// under watchdog.mu (see beatSched).
	sched beatSched
}

type waitState uint8

const (
	waiting waitState = iota
	granted
	failed
	left
)

func (c *Client) newWaiter(name string, k keys, cfg *config, holder string) *waiter {
	return &waiter{c: c, name: name, k: k, cfg: *cfg, holder: holder, wake: make(chan struct{}, 1),
		backoff: minErrorBackoff, sched: beatSched{idx: -1}}
}

// Acquire's retries after transient errors (a failover, a restart) start
// at minErrorBackoff and double up to maxErrorBackoff: the wait goes on
// at most that long after the new master accepts commands.
const (
	minErrorBackoff = 10 * time.Millisecond
	maxErrorBackoff = 250 * time.Millisecond
	// noExpiryWait is how often the first waiter polls when the lock has
	// no expiry (set by hand); a handover still reaches it at once.
	noExpiryWait = time.Second
)

// grantLease is the lease a handover gives this waiter until its first
// renewal: min(lease, liveness), so that a handover to a waiter that died
// since its last heartbeat costs the others at most a liveness period,
// not a lease. A fixed lease is given whole: nothing renews it.
func grantLease(cfg *config) time.Duration {
	if cfg.fixed {
		return cfg.lease
	}
	return min(cfg.lease, cfg.liveness)
}

func (w *waiter) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run waits for the outcome: a grant (the lock), a Redis error that ends
// the wait, ctx's end or the wait limit (wctx), or the client's close.
// The first attempt has been answered (it queued the waiter, or failed
// transiently): beat is when to call next. warm: the channel's
// subscription was confirmed before the first attempt was sent.
func (w *waiter) run(ctx, wctx context.Context, start time.Time, warm bool, beat time.Time) (*Lock, error) {
	c := w.c
	waitStart := time.Now()
	done := func(l *Lock, err error) (*Lock, error) {
		var rep acquireReply
		if l != nil {
			rep.reacquired = w.reacq
		} else {
			rep.pttl = w.pttlNow()
		}
		c.observeAcquire(ctx, w.name, w.holder, start, time.Since(waitStart), l, rep, err)
		return l, err
	}
	if len(c.obs.wait) > 0 {
		c.obs.onWait(ctx, WaitEvent{Name: w.name, Remaining: pttlDuration(w.pttlNow())})
	}
	// A new subscription may have missed a grant published before the
	// server confirmed it: the first heartbeat goes at once then.
	if !warm {
		if err := c.notify.subscribe(wctx, w.k.channel); err != nil && !ctxEnded(wctx) {
			w.subscribeFailed(err)
		}
		beat = minTime(beat, time.Now())
	}
	c.wd.addWaiter(w, beat)
	// A lock's long wait is reported once; a candidate's is its normal
	// state while a leader leads (nil channel: never).
	var long <-chan time.Time
	if w.cfg.campaign == nil {
		t := time.NewTimer(w.cfg.longWait - time.Since(start))
		defer t.Stop()
		long = t.C
	}
	for {
		select {
		case <-long:
			w.reportLongWait(ctx, wctx, time.Since(start))
		case <-w.wake:
			if l, err, end := w.outcome(ctx); end {
				return done(l, err)
			}
		case <-wctx.Done():
			if l, ok := w.leaveOrTake(ctx); ok {
				return done(l, nil)
			}
			return done(nil, waitEndErr(wctx, w.name, w.lastTransient()))
		case <-c.closing:
			return done(nil, ErrClosed) // Close removed the waiter from the queue
		}
	}
}

// outcome acts on a state change: a grant is taken, a failure ends the
// wait. end is false while the wait goes on.
func (w *waiter) outcome(ctx context.Context) (l *Lock, err error, end bool) {
	w.mu.Lock()
	st, fatal := w.state, w.fatal
	w.mu.Unlock()
	switch st {
	case granted:
		l, err = w.take(ctx)
		return l, err, true
	case failed:
		w.leave()
		if errors.Is(fatal, ErrNotAcquired) { // a campaign cut off: its error says all
			return nil, fatal, true
		}
		return nil, fmt.Errorf("fence: acquire %q: %w", w.name, w.c.withFix(fatal)), true
	}
	return nil, nil, false
}

// take turns the grant into this client's lock. With WithReplicaSync the
// handover is confirmed first (a renewal and WAIT on this client's
// connection: WAIT counts only the writes of the connection it runs on,
// and the handover was written by the releaser's).
func (w *waiter) take(ctx context.Context) (*Lock, error) {
	c := w.c
	w.mu.Lock()
	value, start, px, reacq := w.value, w.start, w.px, w.reacq
	w.mu.Unlock()
	w.unschedule()
	// The next waiter of this client takes over the polls at the holder's
	// expiry from its next answer on (see nextBeat): the lock has a holder
	// now, so it need not heartbeat at once.
	c.notify.unregister(w)
	if w.cfg.replicas > 0 {
		s := time.Now()
		if acks, err := c.confirmReplicas(ctx, w.k.lock, value, &w.cfg); err != nil || acks < int64(w.cfg.replicas) {
			c.releaseValue(ctx, w.name, w.k, &w.cfg, value)
			if err != nil {
				return nil, fmt.Errorf("fence: acquire %q: confirm handover: %w", w.name, c.withFix(err))
			}
			return nil, &ReplicaSyncError{Name: w.name, Want: w.cfg.replicas, Got: int(acks), Timeout: w.cfg.replicaTimeout}
		}
		start, px = s, w.cfg.lease
	}
	return c.adopt(ctx, w.name, w.k, &w.cfg, value, start, px, reacq)
}

// leaveOrTake ends the wait without the lock, unless a grant arrived
// first: then the lock is taken after all (ok).
func (w *waiter) leaveOrTake(ctx context.Context) (l *Lock, ok bool) {
	w.mu.Lock()
	st := w.state
	if st == waiting || st == failed {
		w.state = left
	}
	w.mu.Unlock()
	if st == granted {
		if l, err := w.take(ctx); err == nil {
			return l, true
		}
		return nil, false
	}
	w.leave()
	return nil, false
}

// leave takes the waiter out of the client and, with leave.lua, out of
// the queue in Redis; a handover that raced it is passed on at once. The
// script waits for an in-flight heartbeat of this waiter to be answered
// (a heartbeat sent earlier must not run after it), in the background,
// unless the waiter has a fixed holder id (WithHolder): then before Acquire
// returns, so that a retry with the same id cannot be overtaken by it.
func (w *waiter) leave() {
	c := w.c
	idle := w.unschedule()
	c.notify.unregister(w) // leave.lua hands a free lock to the queue's head itself
	run := func() {
		if idle != nil {
			t := time.NewTimer(releaseTimeout)
			select {
			case <-idle:
			case <-t.C:
			case <-c.bgCtx.Done(): // Close's deadline passed: its leave fails fast below
			}
			t.Stop()
		}
		ctx, cancel := context.WithTimeout(c.bgCtx, releaseTimeout)
		defer cancel()
		sent := time.Now()
		call := w.leaveCall()
		rep, err := parseRelease(c.runScript(ctx, call.scriptOr(c.scripts.leave), call.keys, call.args...))
		switch {
		case err != nil:
			c.refreshTopology(err)
			// The place expires at its deadline, a handover at its grant
			// lease: nobody waits longer than that for it.
			c.cfg.logger.Debug("fence: leaving the queue failed", slog.String("name", w.name), slog.Any("err", err))
		case rep.handedOver():
			c.notify.handedTo(w.k.channel, rep.value, sent)
		}
	}
	if w.cfg.holder != "" || !c.goBackground(run) {
		run()
	}
}

// unschedule stops the waiter's heartbeats; it returns a channel closed
// when the one in flight, if any, has been answered.
func (w *waiter) unschedule() <-chan struct{} { return w.c.wd.removeWaiter(w) }

// granted records that the lock is this waiter's (value), with a lease
// of px counting from start; reacq: the lock was this holder id's
// already.
func (w *waiter) granted(value string, start time.Time, px time.Duration, reacq bool) {
	w.mu.Lock()
	if w.state != waiting {
		w.mu.Unlock()
		return // taken, left, failed, or a duplicate (message after a local handover)
	}
	w.state, w.value, w.start, w.px, w.reacq = granted, value, start, px, reacq
	w.mu.Unlock()
	w.poke()
}

// handedOver records a handover (a message or this client's own
// release), whose lease is grantLease, counting from start.
func (w *waiter) handedOver(value string, start time.Time) {
	w.granted(value, start, grantLease(&w.cfg), false)
}

// grantedAt records a handover message: the handover ran at server time
// at (µs); its lease counts from the earliest local time that can be, by
// the last answered call (see syncAt), less 1% of the elapsed time for
// the two clocks' rates.
func (w *waiter) grantedAt(value string, at int64) {
	w.mu.Lock()
	elapsed := time.Duration(at-w.syncSrv) * time.Microsecond
	start := w.syncAt.Add(elapsed - max(elapsed, 0)/100)
	known := !w.syncAt.IsZero()
	w.mu.Unlock()
	if !known {
		// No call answered yet: its heartbeat will find the handover.
		w.c.wd.beatSoon(w)
		return
	}
	w.handedOver(value, start)
}

// answered applies the answer to a call of this waiter (its first
// attempt, a heartbeat) sent at sent, and returns when to heartbeat next.
func (w *waiter) answered(rep acquireReply, sent time.Time, err error) time.Time {
	now := time.Now()
	w.mu.Lock()
	if w.state != waiting {
		w.mu.Unlock()
		return now
	}
	switch {
	case err != nil && transient(err):
		w.lastErr = err
		if w.errSince.IsZero() {
			w.errSince = sent
		}
		if w.cfg.campaign != nil && now.Sub(w.errSince) >= w.cfg.liveness {
			// A candidate cut off from Redis for its liveness has lost its
			// place in the queue: the campaign ends rather than wait on
			// for a term it can no longer be handed.
			w.state, w.fatal = failed, cutOffErr(w.name, w.cfg.liveness, err)
			w.mu.Unlock()
			w.poke()
			return now
		}
		next := now.Add(w.backoff)
		w.backoff = min(2*w.backoff, maxErrorBackoff)
		w.mu.Unlock()
		if connectionError(err) {
			w.c.warnOutage(w.name, w.until, err)
		}
		return next
	case err != nil:
		w.state, w.fatal = failed, err
		w.mu.Unlock()
		w.poke()
		return now
	case rep.acquired:
		w.mu.Unlock()
		// acquire.lua set or restarted the whole lease; it counts from
		// when the call was sent. A handover found by a heartbeat
		// (reacquired) is sure of its grant lease only (see acquire.lua).
		px := w.cfg.lease
		if rep.reacquired {
			px = grantLease(&w.cfg)
		}
		w.granted(rep.value, sent, px, rep.reacquired)
		return now
	}
	w.lastErr, w.backoff, w.errSince = nil, minErrorBackoff, time.Time{}
	w.pttl, w.joined = rep.pttl, rep.queued
	w.syncAt, w.syncSrv = sent, rep.now
	w.mu.Unlock()
	return w.nextBeat(now)
}

// nextBeat is when the waiter heartbeats next after an answer at now:
// every liveness/3 to keep its place; at once when it is not in the queue
// (its first call failed, or it was dropped while it could not heartbeat:
// it joins at the tail again) or the queue's head must be cleared first;
// and, for this client's first waiter of the name, when the holder's lease
// runs out, so that a lock left to expire reaches the queue's head about
// when it is free rather than at the next heartbeat.
func (w *waiter) nextBeat(now time.Time) time.Time {
	w.mu.Lock()
	joined, pttl := w.joined, w.pttl
	w.mu.Unlock()
	if !joined || pttl == 0 {
		return now
	}
	next := now.Add(w.cfg.liveness / 3)
	if w.c.notify.first(w) {
		next = minTime(next, now.Add(retryAfter(pttl)))
	}
	return next
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// beatCall is the waiter's next heartbeat: acquire.lua in 'b' mode, or
// 'w' while it is not in the queue.
func (w *waiter) beatCall() scriptCall {
	w.mu.Lock()
	m := modeBeat
	if !w.joined {
		m = modeWait
	}
	w.mu.Unlock()
	return scriptCall{script: w.c.scriptsOf(&w.cfg).acquire, keys: scriptKeysOf(w.k, &w.cfg), args: acquireArgs(&w.cfg, w.holder, m)}
}

// leaveCall is leave.lua's call for the waiter (nil script: the client's,
// which the caller passes; an election's for a candidate).
func (w *waiter) leaveCall() scriptCall {
	call := scriptCall{keys: scriptKeysOf(w.k, &w.cfg), args: []any{w.holder}}
	if w.cfg.campaign != nil {
		call.script = w.cfg.campaign.e.scripts.leave
	}
	return call
}

// subscribeFailed notes that the waiter has no subscription: it waits on
// its heartbeats (and the first waiter's polls at expiry) meanwhile, and
// says so once per client. When the waiter's own calls cannot reach Redis
// either, the subscription failed with the outage: that is what is said
// (once per client, with the calls' error), and the subscription follows
// when Redis is back. A pub/sub connection that alone cannot reach its
// node (killed, its redials refused) while the calls are answered is a
// subscription matter, as a refused SUBSCRIBE is.
func (w *waiter) subscribeFailed(err error) {
	if last := w.lastTransient(); connectionError(last) &&
		(connectionError(err) || errors.Is(err, errUnconfirmed) || errors.Is(err, errNodeDown)) {
		w.c.warnOutage(w.name, w.until, last)
		return
	}
	w.c.checks.subscribeWarned.Do(func() {
		w.c.configLogger().Warn("fence: cannot subscribe to lock notifications; waiters take a lock at their next "+
			"heartbeat after it is handed to them (liveness/3) instead of at once",
			slog.String("name", w.name), slog.String("err", w.c.withFix(err).Error()))
	})
}

func (w *waiter) pttlNow() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pttl
}

func (w *waiter) lastTransient() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// retryAfter is how long the first waiter waits for a holder's lease to
// run out: its PTTL, plus jitter so that the first waiters of several
// clients do not all heartbeat in the same millisecond.
func retryAfter(pttl int64) time.Duration {
	switch {
	case pttl == -2: // gone between GET and PTTL: at once
		return 0
	case pttl < 0: // no expiry: only a release (or a hand) frees it
		return noExpiryWait
	}
	d := time.Duration(pttl) * time.Millisecond
	return d + rand.N(d/20+2*time.Millisecond)
}

// reportLongWait says, once per wait, who holds the lock the call has
// waited for longer than LongWait, and until when: a holder that crashed
// holds its lock until its lease runs out, and the wait must not pass in
// silence. One round trip (GET and PTTL), bounded, in the waiting
// goroutine: a grant meanwhile waits in w.wake.
func (w *waiter) reportLongWait(ctx, wctx context.Context, waited time.Duration) {
	c := w.c
	e := LongWaitEvent{Name: w.name, Waited: waited}
	rctx, cancel := context.WithTimeout(wctx, 2*time.Second)
	defer cancel()
	pipe := c.rdb.Pipeline()
	val := pipe.Get(rctx, w.k.lock)
	pttl := pipe.PTTL(rctx, w.k.lock)
	sent := time.Now()
	_, _ = pipe.Exec(rctx)
	switch v, err := val.Result(); {
	case errors.Is(err, redis.Nil): // free: being handed over
	case err != nil:
		e.Err = err
	default:
		e.Token, _ = tokenOf(v)
		e.Holder = holderOf(v)
		if d, err := pttl.Result(); err == nil && d > 0 {
			e.Until = sent.Add(d)
		}
	}
	if ctxEnded(wctx) {
		return // the wait ended meanwhile: nothing to say
	}
	attrs := []slog.Attr{slog.String("name", e.Name), slog.Duration("waited", e.Waited.Round(time.Millisecond))}
	switch {
	case e.Err != nil:
		attrs = append(attrs, slog.String("err", e.Err.Error()))
	case e.Holder != "":
		attrs = append(attrs, slog.String("holder", e.Holder), slog.Int64("token", e.Token))
		if !e.Until.IsZero() {
			attrs = append(attrs, slog.Time("until", e.Until.Round(time.Millisecond)),
				slog.Duration("lease_left", e.Until.Sub(sent).Round(time.Millisecond)))
		}
	}
	c.configLogger().LogAttrs(ctx, slog.LevelInfo, "fence: still waiting for a lock held by another holder", attrs...)
	if len(c.obs.long) > 0 {
		c.obs.onLongWait(ctx, e)
	}
}
