package fence

import (
	"context"
	"fmt"
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
	l.end(ErrReleased) // no effect when already ended: the first cause stays
	var err error
	switch cause := l.endCause(); {
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
	if len(l.c.obs.release) > 0 {
		l.c.obs.onRelease(ctx, ReleaseEvent{Name: l.name, Token: l.token, Held: time.Since(l.acquiredAt),
			Duration: time.Since(start), Err: err})
	}
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
// sharedBound): the lock goes to the first live waiter in the same call,
// or is deleted.
func (c *Client) release(ctx context.Context, l *Lock) error {
	sent := time.Now() // before the release, before a handover
	ctx = c.relBound.detach(ctx, sent)
	call := l.releaseCall()
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
