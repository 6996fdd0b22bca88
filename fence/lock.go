package fence

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
)

// Lock is one held acquisition of a named lock. Its methods are safe for
// concurrent use.
type Lock struct {
	c      *Client
	name   string
	keys   keys
	holder string
	token  int64
	// value is the lock key's value, '<token>:<holder>' (acquire.lua): the
	// token first (digits only), so that a holder id may contain ':'.
	value string
	// Script arguments made once per lock rather than per renewal:
	// keyArgs is {lock key}, valueArg is value boxed.
	keyArgs  []string
	valueArg any
	fixed    bool

	acquiredAt time.Time
	ctx        context.Context
	cancel     context.CancelCauseFunc
	deadline   atomic.Int64 // unix ns; local conservative validity
	released   atomic.Bool

	// Guarded by the watchdog's mutex.
	lease     time.Duration
	leaseArg  any // lease in ms, boxed once per lease
	renewAt   time.Time
	maxHoldAt time.Time // zero: no limit
	inflight  bool      // a renewal is on its way
	idx       int       // index in the watchdog heap, -1 when not scheduled
}

// Name is the lock's name.
func (l *Lock) Name() string { return l.name }

// Token is the fencing token of this acquisition: strictly greater than
// the token of every earlier acquisition of the same name. Pass it with
// every write the lock protects, so that the storage can reject a stale
// holder (see package guard).
func (l *Lock) Token() int64 { return l.token }

// Holder is the holder id stored with the lock.
func (l *Lock) Holder() string { return l.holder }

// Context is cancelled the moment the lock is released, lost, or reaches
// its max-hold limit; [Lock.Err] says which. Run the protected work with
// it. It does not derive from the context given to Acquire.
func (l *Lock) Context() context.Context { return l.ctx }

// Done is closed when [Lock.Context] is cancelled.
func (l *Lock) Done() <-chan struct{} { return l.ctx.Done() }

// Err is nil while the lock is held, then [ErrLockLost], [ErrMaxHold],
// [ErrReleased] or [ErrClosed].
func (l *Lock) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Deadline is the local, conservative end of the lock's validity: the start
// of the last successful acquire or renewal request, plus the lease, minus
// a drift margin. The server keeps the lock at least that long. When no
// renewal succeeded by then, the context is cancelled with [ErrLockLost]
// no later than this time (the watchdog's timer is set 2 ms early to
// absorb timer latency).
func (l *Lock) Deadline() time.Time { return time.Unix(0, l.deadline.Load()) }

// driftMargin is taken off the lease when computing the local deadline: it
// covers the difference between the client's and the server's clock rates
// (1 % is far beyond real crystal drift) and the server's expiry
// granularity (2 ms).
func driftMargin(lease time.Duration) time.Duration { return lease/100 + 2*time.Millisecond }

func (l *Lock) setDeadlineFrom(start time.Time, lease time.Duration) {
	d := start.Add(lease - driftMargin(lease)).UnixNano()
	for {
		old := l.deadline.Load()
		if d <= old || l.deadline.CompareAndSwap(old, d) {
			return
		}
	}
}

// Release deletes the lock if it is still ours and wakes a waiter; it
// returns [ErrNotHeld] when the lock expired or another holder has it
// (nothing of theirs is deleted), and on a second call. It cancels the
// lock's context first, with [ErrReleased] unless it was already lost. The
// round trip runs detached from ctx's cancellation (so a cancelled caller
// still releases) and bounded by 5 s.
func (l *Lock) Release(ctx context.Context) error {
	if l.c.isClosed() {
		return ErrClosed
	}
	if !l.released.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: lock %q was already released", ErrNotHeld, l.name)
	}
	l.c.wd.remove(l)
	l.cancel(ErrReleased)  // no effect when already lost: the first cause stays
	if ctx.Done() != nil { // a context that cannot be cancelled needs no detaching
		ctx = context.WithoutCancel(ctx)
	}
	rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	err := l.c.release(rctx, l)
	l.c.forget(l)
	l.c.cfg.observer.Released(Event{Name: l.name, Token: l.token, Duration: time.Since(l.acquiredAt), Err: err})
	return err
}

func (l *Lock) releaseCall() scriptCall {
	args := []any{l.valueArg, l.keys.channel, "0"}
	if l.c.cluster {
		args[2] = "1" // constants are boxed without an allocation
	}
	return scriptCall{keys: l.keyArgs, args: args}
}

// renewCall is the renewal of l for leaseArg, a lease in ms.
func (l *Lock) renewCall(leaseArg any) scriptCall {
	return scriptCall{keys: l.keyArgs, args: []any{l.valueArg, leaseArg}}
}

// Refresh extends a fixed-lease lock ([WithFixedLease]) to lease from now
// (at least [MinLease]), and moves [Lock.Deadline]. It returns [ErrNotHeld]
// (and the lock is lost) when the lock is no longer ours, the lock's error
// when it was already lost or released, and an error for a lock the
// watchdog renews. ctx bounds the round trip.
func (l *Lock) Refresh(ctx context.Context, lease time.Duration) error {
	if l.c.isClosed() {
		return ErrClosed
	}
	if !l.fixed {
		return invalidOption("Refresh on lock %q: the watchdog renews it; Refresh is for WithFixedLease locks", l.name)
	}
	if err := checkLease("Refresh", lease); err != nil {
		return err
	}
	if err := l.Err(); err != nil {
		return err
	}
	start := time.Now()
	call := l.renewCall(lease.Milliseconds())
	res, err := renewScript.Run(ctx, l.c.rdb, call.keys, call.args...).Int64()
	if err != nil {
		return fmt.Errorf("fence: refresh lock %q: %w", l.name, err)
	}
	if res != renewOK {
		l.c.wd.lose(l, ErrLockLost, time.Now())
		return fmt.Errorf("%w: lock %q expired or has another holder", ErrNotHeld, l.name)
	}
	if !l.c.wd.refreshed(l, start, lease) {
		return l.Err()
	}
	return nil
}

func (l *Lock) String() string {
	return "fence.Lock{" + strconv.Quote(l.name) + " token " + strconv.FormatInt(l.token, 10) + "}"
}

// notHeld is the release outcome when the script found another holder or
// no key.
func notHeld(name string) error {
	return fmt.Errorf("%w: lock %q expired or has another holder; nothing was deleted", ErrNotHeld, name)
}
