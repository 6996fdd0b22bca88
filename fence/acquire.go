package fence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/internal/oneline"
	"github.com/redis/go-redis/v9"
)

// The acquire path: TryAcquire, Acquire (whose wait for a held lock is in
// waiter.go), Do, and the attempt they share.

// holderFor is the holder id of one acquisition call: the configured one,
// or a random one kept for every attempt of the call (so that an attempt
// whose reply was lost is taken back by the next).
func holderFor(cfg *config) string {
	if cfg.holder != "" {
		return cfg.holder
	}
	return newHolderID()
}

// TryAcquire makes one attempt to acquire name: one round trip. It returns
// an error matching [ErrNotAcquired] when another holder has the lock, or
// when ctx is done (the error then also matches ctx's error). ctx bounds
// the round trip. With [WithHolder], a lock held by that same holder id is
// handed back (see [WithHolder]).
func (c *Client) TryAcquire(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	cfg, err := c.lockConfig(name, opts)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	holder := holderFor(&cfg)
	l, rep, err := c.attempt(ctx, name, keysFor(cfg.prefix, name), &cfg, holder, modeTry, start)
	switch {
	case err != nil:
		err = c.attemptErr(ctx, name, err, nil)
	case l == nil:
		err = fmt.Errorf("%w: %q is held by another holder (expires in %v)",
			ErrNotAcquired, name, time.Duration(rep.pttl)*time.Millisecond)
	}
	c.observeAcquire(ctx, name, holder, start, 0, l, rep, err)
	return l, err
}

// Acquire acquires name, waiting while another holder has it: it wakes on
// that holder's release message, or when the lock's expiry has passed. The
// wait ends at the earlier of ctx's end and the wait limit (see "Waiting"
// in the package documentation); Acquire then returns an error matching
// [ErrNotAcquired] and the reason (ctx's error, or the wait limit's, which
// matches [context.DeadlineExceeded]), joined with the last transient
// error, if any. It returns [ErrClosed] when the client is closed
// meanwhile. Transient errors — the node unreachable, a failover or slot
// move under way (READONLY, LOADING, MOVED, CLUSTERDOWN) — are waited
// through, retrying with a backoff of at most 250 ms (a Redis that
// cannot be reached at all is also logged, once per client: see "Server
// configuration" in the package documentation); any other Redis error (a
// script error, a refused login or command, which ends with its fix) is
// returned at once. With [WithHolder], a lock held by that same holder id
// is handed back at once.
func (c *Client) Acquire(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	cfg, err := c.lockConfig(name, opts)
	if err != nil {
		return nil, err
	}
	return c.acquire(ctx, name, keysFor(cfg.prefix, name), &cfg)
}

// acquire is Acquire, and a Campaign (cfg.campaign), after validation.
func (c *Client) acquire(ctx context.Context, name string, k keys, cfg *config) (*Lock, error) {
	start := time.Now()
	holder := holderFor(cfg)
	// Every attempt, the first too, is bounded by the wait's end: an
	// attempt that meets an outage (dials retried with backoff) ends with
	// the wait, not at ctx's later deadline.
	wctx, cancel, shared := c.attemptContext(ctx, cfg, start)
	defer func() { cancel() }()
	// Uncontended path: one round trip, no subscription; a held lock
	// queues the caller in the same round trip. When this client's
	// subscription of the name is warm (other waiters use it, or it
	// lingers), the waiter registers first, so that a handover published
	// right after the attempt reaches it.
	var w *waiter
	sent := start // a local time no later than the attempt's
	warm := c.notify.warm(k.channel)
	if warm {
		w = c.newWaiter(name, k, cfg, holder)
		w.until = waitEnd(ctx, cfg)
		warm = c.notify.register(w)
		sent = time.Now()
	}
	l, rep, err := c.attempt(wctx, name, k, cfg, holder, modeWait, sent)
	// A transient error (failover, restart) is waited through, like a
	// held lock.
	if l != nil || (err != nil && (!transient(err) || ctxEnded(wctx))) {
		if w != nil {
			c.notify.unregister(w)
		}
		if err != nil && ctxEnded(wctx) && !errors.As(err, new(unsentError)) {
			// Cut short: the script may have run and queued the caller,
			// or given it the lock. Leave (passing on such a lock).
			c.newWaiter(name, k, cfg, holder).leave()
		}
		err = c.attemptErr(wctx, name, err, nil)
		c.observeAcquire(ctx, name, holder, start, 0, l, rep, err)
		return l, err
	}
	if shared {
		// A wait has its own end, exact also for what selects on Done.
		wctx, cancel = waitContext(ctx, cfg, start)
	}
	if w == nil {
		w = c.newWaiter(name, k, cfg, holder)
		w.until = waitEnd(ctx, cfg) // formatted only for a wait: the outage warning's
		c.notify.register(w)
	}
	next := w.answered(rep, sent, err)
	return w.run(ctx, wctx, start, warm, next)
}

// waitContext is the context that bounds an Acquire: ctx, ended at the
// wait limit when WithWaitLimit was given or ctx has no deadline (so that
// a wait always ends). A Campaign waits for as long as ctx lets it, unless
// WithWaitLimit was given: a standby candidate waits for the leader's
// end, however long the leader lives (a campaign cut off from Redis ends
// by itself, see waiter.answered).
func waitContext(ctx context.Context, cfg *config, start time.Time) (context.Context, context.CancelFunc) {
	if cfg.campaign != nil && !cfg.waitLimitSet {
		return ctx, func() {}
	}
	if _, has := ctx.Deadline(); cfg.waitLimitSet || !has {
		return context.WithDeadlineCause(ctx, start.Add(cfg.waitLimit), cfg.waitLimitErr)
	}
	return ctx, func() {}
}

// attemptContext is the context of an Acquire's first attempt: what
// waitContext returns, or, for a ctx without cancellation (Background, a
// WithValue of it) and the client's own wait limit, the same end from the
// client's shared bound (see sharedBound.until), without a timer, context
// and channel of the call's own. An uncontended Acquire then makes none;
// a call that goes on to wait makes its wait's context then (shared is
// true).
func (c *Client) attemptContext(ctx context.Context, cfg *config, start time.Time) (_ context.Context, _ context.CancelFunc, shared bool) {
	if ctx.Done() == nil && cfg.campaign == nil && c.waitBound.step > 0 && cfg.waitLimit == c.waitBound.d {
		if _, has := ctx.Deadline(); cfg.waitLimitSet || !has {
			return c.waitBound.until(ctx, start, start.Add(cfg.waitLimit)), func() {}, true
		}
	}
	wctx, cancel := waitContext(ctx, cfg, start)
	return wctx, cancel, false
}

// waitEnd says what ends a wait that waitContext bounds, for the outage
// warning: a wait through an outage must not read as one without end.
func waitEnd(ctx context.Context, cfg *config) string {
	if d, has := ctx.Deadline(); has && !cfg.waitLimitSet {
		return fmt.Sprintf("its context's deadline (in %v)", time.Until(d).Round(time.Millisecond))
	}
	if cfg.waitLimitSet {
		return fmt.Sprintf("its wait limit, %v after the call (WithWaitLimit)", cfg.waitLimit)
	}
	return fmt.Sprintf("the default wait limit, %v after the call (DefaultWaitLimit; set another with WithWaitLimit or a context deadline)", cfg.waitLimit)
}

func (c *Client) observeAcquire(ctx context.Context, name, holder string, start time.Time, waited time.Duration,
	l *Lock, rep acquireReply, err error) {
	if len(c.obs.acquire) == 0 {
		return
	}
	e := AcquireEvent{Name: name, Holder: holder, Duration: time.Since(start), Waited: waited, Err: err}
	if l != nil {
		e.Token, e.Reacquired = l.token, rep.reacquired
	} else if rep.pttl != 0 {
		e.Remaining = pttlDuration(rep.pttl)
	}
	c.obs.onAcquire(ctx, e)
}

func pttlDuration(pttl int64) time.Duration {
	if pttl < 0 {
		return -1
	}
	return time.Duration(pttl) * time.Millisecond
}

// attemptErr turns an attempt's error into the caller's. An attempt or
// wait that ended with ctx (or the wait context) matches ErrNotAcquired
// and the context's cause, joined with the last transient error: last, or
// err itself when the end cut short an attempt that met one, or what
// dialCause finds when go-redis's retries hid the cause behind the
// context's error. Other Redis errors are the attempt's, with the name;
// fence's own (ErrClosed, *ReplicaSyncError) pass as they are.
func (c *Client) attemptErr(ctx context.Context, name string, err, last error) error {
	if err == nil {
		return nil // before the targets of errors.As, which live on the heap
	}
	var (
		rse    *ReplicaSyncError
		unsent unsentError
	)
	switch {
	case errors.Is(err, ErrClosed) || errors.As(err, &rse):
		return err
	case ctxEnded(ctx):
		switch {
		case transient(err):
			last = err
		case last == nil && !errors.As(err, &unsent):
			last = c.dialCause(name)
		}
		return waitEndErr(ctx, name, last)
	}
	return fmt.Errorf("fence: acquire %q: %w", name, c.withFix(err))
}

// unsentError is an attempt's error when its context was done before
// anything was sent.
type unsentError struct{ err error }

func (e unsentError) Error() string { return e.err.Error() }
func (e unsentError) Unwrap() error { return e.err }

// waitEndErr is the error of an acquisition that ended with ctx: it
// matches ErrNotAcquired and ctx's cause, and last, the transient error
// the wait was riding out, if any (an outage is then told apart from
// contention).
func waitEndErr(ctx context.Context, name string, last error) error {
	err := notAcquiredCtx(ctx, name)
	if last != nil {
		err = fmt.Errorf("%w; last error: %w", err, last)
	}
	return err
}

// ctxEnded is ctx.Err() != nil, also in the instant after its deadline
// passed and before its Done closes: a connection deadline set from ctx
// (ContextTimeoutEnabled) can fire first.
func ctxEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

func notAcquiredCtx(ctx context.Context, name string) error {
	cause := context.Cause(ctx)
	if cause == nil { // deadline passed, Done not closed yet
		cause = deadlineCause(ctx)
	}
	return fmt.Errorf("%w: %q: %w", ErrNotAcquired, name, cause)
}

// Do acquires name (waiting like [Client.Acquire]), runs fn with a context
// that is cancelled when ctx is done or the lock is lost, and releases the
// lock. It returns fn's error joined with the lock's loss ([ErrLockLost],
// [ErrMaxHold]) if the lock was lost while fn ran (once: an error of fn
// that wraps the loss is returned alone), or with the release error.
func (c *Client) Do(ctx context.Context, name string, fn func(ctx context.Context, l *Lock) error, opts ...LockOption) error {
	if fn == nil {
		return invalidOption("Do(%q): fn is nil", name)
	}
	l, err := c.Acquire(ctx, name, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	lctx := l.Context()
	stop := context.AfterFunc(lctx, func() { cancel(context.Cause(lctx)) })
	ferr := fn(fctx, l)
	stop()
	cancel(nil)
	lost := l.Err()
	rerr := l.Release(ctx)
	switch {
	case lost == nil:
		return oneline.Join(ferr, rerr)
	case errors.Is(ferr, lost):
		// fn returned the loss already (wrapped, as guard.Exec does):
		// once is enough.
		return ferr
	}
	return oneline.Join(ferr, lost)
}

// acquireArgs are acquire.lua's arguments (see there and queue.lua); a
// candidate's value follows, except in a heartbeat (the queue has it).
func acquireArgs(cfg *config, holder string, m mode) []any {
	if cfg.campaign != nil && m != modeBeat {
		return []any{holder, cfg.leaseArg, cfg.modeArgs[m], cfg.campaign.value}
	}
	return []any{holder, cfg.leaseArg, cfg.modeArgs[m]}
}

// scriptsOf are the scripts of an acquisition: the client's, or its
// election's for a Campaign.
func (c *Client) scriptsOf(cfg *config) *scriptSet {
	if cfg.campaign != nil {
		return cfg.campaign.e.scripts
	}
	return c.scripts
}

// scriptKeysOf are the keys of acquire.lua, release.lua and leave.lua for
// an acquisition: the lock's, or its election's six.
func scriptKeysOf(k keys, cfg *config) []string {
	if cfg.campaign != nil {
		return cfg.campaign.e.keys
	}
	return k.scriptKeys()
}

// attempt runs the acquire script once, in mode (modeTry or modeWait).
// It returns the lock, or the reply saying the lock is held (and, in
// modeWait, that the caller is queued). start is a local time no later
// than the script's send: the lock's lease counts from it.
func (c *Client) attempt(ctx context.Context, name string, k keys, cfg *config, holder string, m mode, start time.Time) (*Lock, acquireReply, error) {
	if err := ctx.Err(); err != nil {
		return nil, acquireReply{}, unsentError{err} // a done ctx sends nothing
	}
	call := scriptCall{keys: scriptKeysOf(k, cfg), args: acquireArgs(cfg, holder, m)}
	var (
		rep  acquireReply
		acks int64
		err  error
	)
	if cfg.replicas > 0 {
		rep, acks, err = c.acquireAndWait(ctx, call, cfg)
	} else {
		var v any
		v, err = c.runScript(ctx, c.scriptsOf(cfg).acquire, call.keys, call.args...).Result()
		if err == nil {
			rep, err = parseAcquire(v)
		}
	}
	if err != nil {
		c.refreshTopology(err)
		return nil, acquireReply{}, err // the caller names the call (attemptErr)
	}
	if !rep.acquired {
		return nil, rep, nil
	}
	if cfg.replicas > 0 && acks < int64(cfg.replicas) {
		c.releaseValue(ctx, name, k, cfg, rep.value)
		return nil, acquireReply{}, &ReplicaSyncError{Name: name, Want: cfg.replicas, Got: int(acks), Timeout: cfg.replicaTimeout}
	}
	l, err := c.adopt(ctx, name, k, cfg, rep.value, start, cfg.lease, rep.reacquired)
	return l, rep, err
}

// adopt makes the Lock of an acquisition or a handover whose value the
// server holds for us: its lease px (a handover's may be shorter than
// cfg.lease until the first renewal) counts from start, a local time no
// later than when the server set it.
func (c *Client) adopt(ctx context.Context, name string, k keys, cfg *config, value string, start time.Time,
	px time.Duration, reacquired bool) (*Lock, error) {
	tok, err := tokenOf(value)
	if err != nil {
		return nil, err
	}
	// The holder and the value share one string (no copies).
	l := &Lock{c: c, name: name, keys: k, holder: holderOf(value), token: tok,
		value: value, valueArgs: [1]any{value}, fixed: cfg.fixed, acquiredAt: start,
		sched: lockSched{lease: cfg.lease, leaseArg: cfg.leaseArg, renewAt: start.Add(px / 3), idx: -1}}
	l.scriptKeys = scriptKeysOf(k, cfg)
	l.keyArgs = l.scriptKeys[:1:1]
	if cfg.campaign != nil {
		l.elect = cfg.campaign.e
	}
	// The lock's context, once made, carries ctx's values (trace ids),
	// not its cancellation.
	l.acq = ctx
	l.setDeadlineFrom(start, px)
	if cfg.maxHold > 0 {
		l.sched.maxHoldAt = start.Add(cfg.maxHold)
	}
	c.mu.Lock()
	if c.isClosed() {
		c.mu.Unlock()
		_ = c.release(ctx, l)
		l.end(ErrClosed)
		return nil, ErrClosed
	}
	old := c.locks[k.lock]
	if old != nil && reacquired && old.value == value && c.wd.refreshed(old, start, cfg.lease) {
		// This client's own lock, taken again by its holder id: the same
		// Lock, its lease restarted (not re-entrancy: one Release ends it).
		c.mu.Unlock()
		l.end(ErrReleased)
		return old, nil
	}
	c.locks[k.lock] = l
	c.wd.add(l)
	c.mu.Unlock()
	if old != nil && old.value != l.value {
		// The server gave the name to a new acquisition: the old one is
		// no longer held, whatever its deadline says.
		c.wd.lose(old, &LostError{Name: name, Token: old.token, Reason: ReasonTaken, TakenBy: l.holder, TakenToken: l.token}, time.Now())
	}
	return l, nil
}

// confirmReplicas renews a handed-over lock (value) and runs WAIT in one
// pipeline on the key's master, and returns how many replicas have the
// renewal, hence the handover before it.
func (c *Client) confirmReplicas(ctx context.Context, key, value string, cfg *config) (int64, error) {
	var node scripter = c.rdb
	if c.router != nil {
		n, err := c.router.MasterForKey(ctx, key)
		if err != nil {
			return 0, err
		}
		node = n
	}
	for try := 0; ; try++ {
		pipe := node.Pipeline()
		var renew *redis.Cmd
		if try == 0 {
			renew = renewScript.EvalSha(ctx, pipe, []string{key}, value, cfg.leaseArg)
		} else { // EVAL loads the script without SCRIPT LOAD (see execScripts)
			renew = renewScript.Eval(ctx, pipe, []string{key}, value, cfg.leaseArg)
		}
		wait := pipe.Do(ctx, "wait", cfg.replicas, cfg.replicaTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		if isNoScript(renew.Err()) && try == 0 {
			continue
		}
		res, _, err := parseRenew(renew)
		if err != nil {
			return 0, err
		}
		if res != renewOK {
			return 0, fmt.Errorf("the handed-over lock was gone before it was confirmed")
		}
		return wait.Int64()
	}
}

// acquireAndWait runs the acquire script and WAIT in one pipeline on one
// connection: WAIT counts the replicas that have the writes of its own
// connection.
func (c *Client) acquireAndWait(ctx context.Context, call scriptCall, cfg *config) (acquireReply, int64, error) {
	var node scripter = c.rdb
	if c.router != nil {
		n, err := c.router.MasterForKey(ctx, call.keys[0])
		if err != nil {
			return acquireReply{}, 0, err
		}
		node = n
	}
	for try := 0; ; try++ {
		pipe := node.Pipeline()
		var acq *redis.Cmd
		if try == 0 {
			acq = c.scriptsOf(cfg).acquire.EvalSha(ctx, pipe, call.keys, call.args...)
		} else { // EVAL loads the script without SCRIPT LOAD (see execScripts)
			acq = c.scriptsOf(cfg).acquire.Eval(ctx, pipe, call.keys, call.args...)
		}
		wait := pipe.Do(ctx, "wait", cfg.replicas, cfg.replicaTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		if isNoScript(acq.Err()) && try == 0 {
			continue
		}
		v, err := acq.Result()
		if err != nil {
			return acquireReply{}, 0, err
		}
		rep, err := parseAcquire(v)
		if err != nil {
			return acquireReply{}, 0, err
		}
		acks, err := wait.Int64()
		if err != nil && rep.acquired {
			acks = 0 // the lock is released by the caller: no acknowledged copy
		}
		return rep, acks, nil
	}
}
