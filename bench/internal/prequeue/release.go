package prequeue

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
// and bounded by 5 s.
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

func (l *Lock) releaseCall() scriptCall {
	return scriptCall{keys: l.keyArgs, args: []any{l.valueArg, l.keys.channel, l.c.spublishArg()}}
}

// release.lua's ARGV[3], boxed once: "1" to notify with SPUBLISH (a
// cluster's sharded pub/sub), "0" with PUBLISH.
var spublishOn, spublishOff any = "1", "0"

func (c *Client) spublishArg() any {
	if c.cluster {
		return spublishOn
	}
	return spublishOff
}

// release runs the release script for l, detached from ctx's
// cancellation and bounded by releaseTimeout. When it published nothing
// (the lock was gone, or the call failed), the head waiter of this client
// is woken locally: it may be waiting for this lock's release message
// alone.
func (c *Client) release(ctx context.Context, l *Lock) error {
	if ctx.Done() != nil { // a context that cannot be cancelled needs no detaching
		ctx = context.WithoutCancel(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	call := l.releaseCall()
	n, err := releaseScript.Run(ctx, c.rdb, call.keys, call.args...).Int64()
	if err != nil {
		c.refreshTopology(err)
		c.waiter.wakeChannel(l.keys.channel)
		return fmt.Errorf("fence: release %q: %w", l.name, err)
	}
	return c.releaseOutcome(l, n)
}

// Release outcomes returned by release.lua.
const (
	releaseNotOurs     = 0
	releaseOK          = 1
	releaseUnpublished = 2 // deleted; the release message was refused
)

// releaseOutcome turns release.lua's reply for l into Release's error.
// When no message was published, this client's head waiter is woken
// locally: it may be waiting for this lock's release message alone.
func (c *Client) releaseOutcome(l *Lock, n int64) error {
	switch n {
	case releaseOK:
		return nil
	case releaseUnpublished:
		c.waiter.wakeChannel(l.keys.channel)
		c.warnPublishRefused(l.name)
		return nil
	default:
		c.waiter.wakeChannel(l.keys.channel)
		return notHeld(l.name)
	}
}

// notHeld is the release outcome when the script found another holder or
// no key.
func notHeld(name string) error {
	return fmt.Errorf("%w: lock %q expired or has another holder; nothing was deleted", ErrNotHeld, name)
}
