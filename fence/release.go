package fence

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Release deletes the lock if it is still ours and wakes a waiter. It
// returns [ErrNotHeld] when the lock is no longer ours: it expired or
// another holder has it (nothing of theirs is deleted), it was already
// released, or it ended locally before (the error then also carries why:
// a [*LostError] or [ErrMaxHold]). It cancels the lock's context first,
// with [ErrReleased] unless it had already ended. The round trip runs
// detached from ctx's cancellation (so a cancelled caller still releases)
// and bounded by 5 to 6 s (the releases of one second share a deadline).
func (l *Lock) Release(ctx context.Context) error {
	if l == nil {
		return errNilLock("Release")
	}
	if l.c.isClosed() {
		return ErrClosed
	}
	if !l.released.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: lock %q was already released", ErrNotHeld, l.name)
	}
	start := time.Now()
	l.c.wd.remove(l)
	l.cancel(ErrReleased) // no effect when already ended: the first cause stays
	var err error
	switch cause := context.Cause(l.ctx); {
	case cause == ErrReleased:
		err = l.c.release(ctx, l)
		l.c.forget(l)
	case cause == ErrMaxHold && l.c.newest(l):
		// Still ours on the server until its lease runs out: free it now.
		_ = l.c.release(ctx, l)
		err = ended(l, "ended before Release", cause)
	default:
		// Lost: the key is gone, someone else's, or within its drift
		// margin of expiring; and with WithHolder, a later acquisition
		// by the same holder id may own the same value now. Nothing to
		// delete.
		err = ended(l, "ended before Release", cause)
	}
	l.c.obs.onRelease(ctx, ReleaseEvent{Name: l.name, Token: l.token, Held: time.Since(l.acquiredAt),
		Duration: time.Since(start), Err: err})
	return err
}

// releaseCall is l's release: release.lua, the election's for a term
// (nil script: the client's, which the caller passes).
func (l *Lock) releaseCall() scriptCall {
	call := scriptCall{keys: l.scriptKeys, args: l.valueArgs[:]}
	if l.elect != nil {
		call.script = l.elect.scripts.release
	}
	return call
}

// release runs the release script for l, detached from ctx's
// cancellation and bounded by the client's shared release bound (see
// releaseBound): the lock goes to the first live waiter in the same call,
// or is deleted.
func (c *Client) release(ctx context.Context, l *Lock) error {
	ctx = c.relBound.detach(ctx, time.Now())
	call := l.releaseCall()
	sent := time.Now()
	rep, err := parseRelease(c.runScript(ctx, call.scriptOr(c.scripts.release), call.keys, call.args...))
	if err != nil {
		c.refreshTopology(err)
		return fmt.Errorf("fence: release %q: %w", l.name, c.withFix(err))
	}
	return c.releaseOutcome(l, rep, sent)
}

// releaseValue releases a lock value this client holds on the server but
// did not make a Lock of (a replica sync that fell short), passing it on
// like a release; errors are dropped: the lock then expires.
func (c *Client) releaseValue(ctx context.Context, name string, k keys, cfg *config, value string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	sent := time.Now()
	rep, err := parseRelease(c.runScript(ctx, c.scriptsOf(cfg).release, scriptKeysOf(k, cfg), value))
	if err == nil && rep.handedOver() {
		c.notify.handedTo(k.channel, rep.value, sent)
	}
}

// releaseOutcome turns release.lua's reply for l into Release's error. A
// handover to a waiter of this client reaches it at once (sent is when
// the release was sent, before the handover), without the message.
func (c *Client) releaseOutcome(l *Lock, rep releaseReply, sent time.Time) error {
	if rep.outcome == releaseNotOurs {
		return notHeld(l.name)
	}
	if rep.handedOver() {
		c.notify.handedTo(l.keys.channel, rep.value, sent)
	}
	if rep.refused != "" {
		c.warnPublishRefused(l.name, rep.refused)
	}
	return nil
}

// notHeld is the release outcome when the script found another holder or
// no key.
func notHeld(name string) error {
	return fmt.Errorf("%w: lock %q expired or has another holder; nothing was deleted", ErrNotHeld, name)
}

// boundStep is how long the releases of a client share one deadline: a
// release is bounded by releaseTimeout to releaseTimeout+boundStep.
const boundStep = time.Second

// releaseBound is the deadline the releases of one boundStep share: a
// context made once per step (its deadline releaseTimeout+boundStep after
// it), so that a release makes no timer, context and channel of its own
// (4 of the 14 allocations fence itself made per acquire+release). An
// epoch is handed out for boundStep and then left to its timer: the
// releases that took it keep at least releaseTimeout.
type releaseBound struct {
	cur atomic.Pointer[boundEpoch]
}

type boundEpoch struct {
	ctx context.Context
	// cancel is never called: the epoch ends at its deadline, after the
	// releases that took it.
	cancel context.CancelFunc
	until  time.Time // handed out until then
}

// get returns the epoch of now.
func (b *releaseBound) get(now time.Time) context.Context {
	for {
		e := b.cur.Load()
		if e != nil && now.Before(e.until) {
			return e.ctx
		}
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout+boundStep)
		if b.cur.CompareAndSwap(e, &boundEpoch{ctx: ctx, cancel: cancel, until: now.Add(boundStep)}) {
			return ctx
		}
		cancel() // another release made the epoch: take it
	}
}

// detach returns ctx's values with the bound of now instead of ctx's
// cancellation.
func (b *releaseBound) detach(ctx context.Context, now time.Time) context.Context {
	if ctx.Done() != nil {
		// Without the caller's cancellation, so that context.Cause of the
		// release's context never reads the caller's.
		ctx = context.WithoutCancel(ctx)
	}
	return detached{values: ctx, bound: b.get(now)}
}

// detached is a context with the values of one context (trace ids for
// go-redis's hooks) and the deadline and cancellation of another. A key
// values does not have is bound's: the context package's own, so that a
// context derived from a detached one (go-redis's dial) joins bound's
// cancellation directly, without a goroutine of its own, and
// context.Cause reads bound's cause.
type detached struct {
	values, bound context.Context
}

func (d detached) Deadline() (time.Time, bool) { return d.bound.Deadline() }
func (d detached) Done() <-chan struct{}       { return d.bound.Done() }
func (d detached) Err() error                  { return d.bound.Err() }
func (d detached) Value(key any) any {
	if v := d.values.Value(key); v != nil {
		return v
	}
	return d.bound.Value(key)
}
