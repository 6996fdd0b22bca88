package fence

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
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
	// scriptKeys are release.lua's keys, keyArgs is {lock key} (renew.lua's),
	// valueArgs is {value} boxed: release.lua's arguments, and renew.lua's
	// first.
	scriptKeys []string
	keyArgs    []string
	valueArgs  [1]any
	fixed      bool
	// elect is the election whose term this is (Campaign), nil for a
	// lock: its release is the election's script.
	elect *Election

	acquiredAt time.Time
	// acq is the acquiring call's context: its values (trace ids) are the
	// lock context's and the observers', never its cancellation (see
	// values; under endMu).
	acq      context.Context
	deadline atomic.Int64 // unix ns; local conservative validity
	released atomic.Bool

	// endMu guards why the lock ended, its context, and acq once it is
	// stripped of its cancellation (valuesLocked). The context is
	// made by the first call that needs it (Context, Done, Do): a lock
	// nobody watches costs no context, and its end only records the
	// cause.
	endMu  sync.Mutex
	cause  error // nil while held, then the first cause
	ctx    context.Context
	cancel context.CancelCauseFunc

	// sched is the watchdog's: its schedule of the lock's renewals, under
	// watchdog.mu (see lockSched).
	sched lockSched
}

// A nil *Lock (what a failed Acquire returns) answers every method
// without panicking: getters return zero values, [Lock.Err] and the
// actions return [ErrNotHeld], and its context is already cancelled.
var nilLockCtx = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(fmt.Errorf("%w: nil *fence.Lock", ErrNotHeld))
	return ctx
}()

func errNilLock(method string) error {
	return fmt.Errorf("%w: %s on a nil *fence.Lock (the acquisition failed)", ErrNotHeld, method)
}

// Name is the lock's name.
func (l *Lock) Name() string {
	if l == nil {
		return ""
	}
	return l.name
}

// Token is the fencing token of this acquisition: strictly greater than
// the token of every earlier acquisition of the same name. Pass it with
// every write the lock protects, so that the storage can reject a stale
// holder (see package guard).
func (l *Lock) Token() int64 {
	if l == nil {
		return 0
	}
	return l.token
}

// Holder is the holder id stored with the lock.
func (l *Lock) Holder() string {
	if l == nil {
		return ""
	}
	return l.holder
}

// Context is cancelled the moment the lock is released, lost, or reaches
// its max-hold limit; [Lock.Err] says which. Run the protected work with
// it. It carries the values of the context given to Acquire (trace ids,
// say) but not its cancellation: the lock outlives the acquiring call.
func (l *Lock) Context() context.Context {
	if l == nil {
		return nilLockCtx
	}
	l.endMu.Lock()
	defer l.endMu.Unlock()
	if l.ctx == nil {
		l.ctx, l.cancel = context.WithCancelCause(l.valuesLocked())
		if l.cause != nil {
			l.cancel(l.cause)
		}
	}
	return l.ctx
}

// values is the acquiring call's context without its cancellation,
// made once (observers ask at every renewal).
func (l *Lock) values() context.Context {
	l.endMu.Lock()
	defer l.endMu.Unlock()
	return l.valuesLocked()
}

func (l *Lock) valuesLocked() context.Context {
	if l.acq.Done() != nil {
		l.acq = context.WithoutCancel(l.acq)
	}
	return l.acq
}

// end records that l ended with cause and cancels its context, if made;
// false when it had ended already (the first cause stays).
func (l *Lock) end(cause error) bool {
	l.endMu.Lock()
	defer l.endMu.Unlock()
	if l.cause != nil {
		return false
	}
	l.cause = cause
	if l.cancel != nil {
		l.cancel(cause)
	}
	return true
}

// endCause is why l ended, nil while it is held.
func (l *Lock) endCause() error {
	l.endMu.Lock()
	defer l.endMu.Unlock()
	return l.cause
}

// Done is closed when [Lock.Context] is cancelled.
func (l *Lock) Done() <-chan struct{} { return l.Context().Done() }

// Err is nil while the lock is held, then why it ended: a [*LostError]
// (matching [ErrLockLost]) that says why the lock was lost, [ErrMaxHold],
// [ErrReleased] or [ErrClosed]. On a nil *Lock it is [ErrNotHeld].
func (l *Lock) Err() error {
	if l == nil {
		return context.Cause(nilLockCtx)
	}
	return l.endCause()
}

// Deadline is the local, conservative end of the lock's validity: the start
// of the last successful acquire or renewal request, plus the lease, minus
// a drift margin. The server keeps the lock at least that long. When no
// renewal succeeded by then, the context is cancelled with [ErrLockLost]
// no later than this time (the watchdog's timer is set 2 ms early to
// absorb timer latency).
func (l *Lock) Deadline() time.Time {
	if l == nil {
		return time.Time{}
	}
	return time.Unix(0, l.deadline.Load())
}

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

// renewCall is the renewal of l for leaseArg, a lease in ms.
func (l *Lock) renewCall(leaseArg any) scriptCall {
	return scriptCall{keys: l.keyArgs, args: []any{l.valueArgs[0], leaseArg}}
}

// Refresh extends a fixed-lease lock ([WithFixedLease]) to lease from now
// (at least [MinLease]), and moves [Lock.Deadline]. A lock that ended
// (released, lost, max hold, closed) is refused with an error matching
// [ErrNotHeld] and the lock's own error ([Lock.Err]: [ErrReleased], a
// [*LostError], ...), whatever kind of lock it was; one that the server
// no longer holds for us is refused the same way, and is lost from then
// on. A held lock that the watchdog renews is refused with
// [ErrInvalidOption]. ctx bounds the round trip.
func (l *Lock) Refresh(ctx context.Context, lease time.Duration) error {
	if l == nil {
		return errNilLock("Refresh")
	}
	if l.c.isClosed() {
		return ErrClosed
	}
	if err := l.Err(); err != nil {
		return ended(l, "ended before Refresh", err)
	}
	if !l.fixed {
		return invalidOption("Refresh on lock %q: the watchdog renews it; Refresh is for WithFixedLease locks", l.name)
	}
	if err := checkLease("Refresh", lease); err != nil {
		return err
	}
	start := time.Now()
	call := l.renewCall(lease.Milliseconds())
	res, other, err := parseRenew(l.c.runScript(ctx, renewScript, call.keys, call.args...))
	if err != nil {
		return fmt.Errorf("fence: refresh lock %q: %w", l.name, l.c.withFix(err))
	}
	if res != renewOK {
		cause := l.renewLoss(res, other)
		l.c.wd.lose(l, cause, time.Now())
		return ended(l, "found by Refresh", cause)
	}
	if !l.c.wd.refreshed(l, start, lease) {
		return ended(l, "ended during Refresh", l.Err())
	}
	return nil
}

// renewLoss is the cause of a loss found by a renewal (or Refresh) that
// answered res (renewGone or renewNotOurs, with the other value).
func (l *Lock) renewLoss(res int64, other string) *LostError {
	e := &LostError{Name: l.name, Token: l.token, Reason: ReasonGone}
	if res == renewNotOurs {
		e.Reason = ReasonTaken
		if t, h, ok := strings.Cut(other, ":"); ok {
			e.TakenBy = h
			e.TakenToken, _ = strconv.ParseInt(t, 10, 64)
		}
	}
	return e
}

// deadlineLoss is the cause of a loss at the local deadline. Called with
// watchdog.mu held (sched.renewErr).
func (l *Lock) deadlineLoss() *LostError {
	if l.fixed {
		return &LostError{Name: l.name, Token: l.token, Reason: ReasonLeaseEnded}
	}
	return &LostError{Name: l.name, Token: l.token, Reason: ReasonDeadline, LastErr: l.sched.renewErr}
}

// lost cancels l with cause, forgets it, wakes a waiter of this client
// that may wait for this lock's release message alone (a lost lock
// publishes none), and tells the observers. The watchdog has unscheduled
// l already.
func (c *Client) lost(l *Lock, cause error, now time.Time) {
	if l.endCause() != nil {
		return
	}
	c.forget(l)
	if !l.end(cause) {
		return // ended meanwhile
	}
	c.notify.poll(l.keys.channel) // a lost lock hands nothing over
	c.obs.onLoss(l.values(), LossEvent{Name: l.name, Token: l.token, Held: now.Sub(l.acquiredAt), Err: cause})
}

func (l *Lock) String() string {
	if l == nil {
		return "fence.Lock(nil)"
	}
	return "fence.Lock{" + strconv.Quote(l.name) + " token " + strconv.FormatInt(l.token, 10) + "}"
}
