package fence

import (
	"context"
	"sync/atomic"
	"time"
)

// boundStep is how long the releases of a client share one deadline: a
// release is bounded by releaseTimeout to releaseTimeout+boundStep.
const boundStep = time.Second

// minBoundStep is the shortest step worth sharing a bound for: with a
// shorter one, nearly every call would make an epoch of its own.
const minBoundStep = 10 * time.Millisecond

// sharedBound is a deadline that the calls of one step share: a context
// made once per step, with its deadline d+step after it, so that a call
// makes no timer, context and channel of its own. An epoch is handed out
// for step and then left to its timer: the calls that took it keep at
// least d. A client has two: its releases' (d releaseTimeout), and the
// first attempts of its Acquire calls' (d the client's wait limit; see
// Client.attemptContext).
type sharedBound struct {
	d, step time.Duration
	cause   error // the epochs' cause at their deadline; nil: context.DeadlineExceeded
	cur     atomic.Pointer[boundEpoch]
}

type boundEpoch struct {
	ctx context.Context
	// cancel is never called: the epoch ends at its deadline, after the
	// calls that took it.
	cancel context.CancelFunc
	until  time.Time // handed out until then
}

// get returns the epoch of now.
func (b *sharedBound) get(now time.Time) context.Context {
	for {
		e := b.cur.Load()
		if e != nil && now.Before(e.until) {
			return e.ctx
		}
		ctx, cancel := context.WithDeadlineCause(context.Background(), now.Add(b.d+b.step), b.cause)
		if b.cur.CompareAndSwap(e, &boundEpoch{ctx: ctx, cancel: cancel, until: now.Add(b.step)}) {
			return ctx
		}
		cancel() // another call made the epoch: take it
	}
}

// detach returns ctx's values with the bound of now instead of ctx's
// cancellation.
func (b *sharedBound) detach(ctx context.Context, now time.Time) context.Context {
	if ctx.Done() != nil {
		// Without the caller's cancellation, so that context.Cause of the
		// call's context never reads the caller's.
		ctx = context.WithoutCancel(ctx)
	}
	return detached{values: ctx, bound: b.get(now)}
}

// until returns ctx, which must have no cancellation of its own, ending
// at deadline, which must be d after now: its Deadline is deadline, and it
// is done with the epoch of now (deadline to deadline+step). What reads
// the deadline (a dial, the connection's deadlines under go-redis's
// ContextTimeoutEnabled, ctxEnded) ends at deadline itself; what selects
// on Done (the pool's wait, a retry's backoff), up to step later.
func (b *sharedBound) until(ctx context.Context, now, deadline time.Time) context.Context {
	return detached{values: ctx, bound: b.get(now), deadline: deadline, cause: b.cause}
}

// detached is a context with the values of one context (trace ids for
// go-redis's hooks) and the cancellation of another, bound, and bound's
// deadline or an earlier one. A key values does not have is bound's: the
// context package's own, so that a context derived from a detached one
// (go-redis's dial) joins bound's cancellation directly, without a
// goroutine of its own, and context.Cause reads bound's cause.
type detached struct {
	values, bound context.Context
	deadline      time.Time // zero: bound's
	cause         error     // the cause once deadline has passed (see deadlineCause)
}

func (d detached) Deadline() (time.Time, bool) {
	if !d.deadline.IsZero() {
		return d.deadline, true
	}
	return d.bound.Deadline()
}
func (d detached) Done() <-chan struct{} { return d.bound.Done() }
func (d detached) Err() error            { return d.bound.Err() }
func (d detached) Value(key any) any {
	if v := d.values.Value(key); v != nil {
		return v
	}
	return d.bound.Value(key)
}

// deadlineCause is the cause of ctx's end when its deadline has passed
// and its Done is not closed yet: a detached context's own cause, else
// context.DeadlineExceeded.
func deadlineCause(ctx context.Context) error {
	if d, ok := ctx.(detached); ok && d.cause != nil {
		return d.cause
	}
	return context.DeadlineExceeded
}
