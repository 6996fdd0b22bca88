package fence

import (
	"context"
	"log/slog"
	"time"
)

// Observer receives a client's lock events, e.g. to feed metrics or
// traces ([WithObserver]). It is any value that implements one or more of
// the event interfaces [AcquireObserver], [WaitObserver],
// [LongWaitObserver], [RenewObserver], [LossObserver] and
// [ReleaseObserver]; fence calls only those it implements. A new kind of event comes as a new interface, and a new
// detail as a new field of its event struct, so an observer written today
// keeps compiling.
//
// Methods are called synchronously, some from the client's watchdog
// goroutine: they must be fast and must not call back into the Client.
// The ctx they get carries the values of the call the event belongs to
// (the Acquire or Release call; for renewals and losses, the Acquire call
// that took the lock), never a cancellation: observers may use it for
// trace spans, not to bound work.
type Observer any

// AcquireObserver is told the outcome of every [Client.TryAcquire] and
// [Client.Acquire] (and of [Client.Do]'s acquisition) that got past input
// validation, including a TryAcquire that found the lock held.
type AcquireObserver interface {
	OnAcquire(ctx context.Context, e AcquireEvent)
}

// WaitObserver is told when an Acquire starts waiting for another holder:
// it is subscribed to the release message and its last attempt found the
// lock held (or it queued behind other waiters of its client).
type WaitObserver interface {
	OnWait(ctx context.Context, e WaitEvent)
}

// LongWaitObserver is told once per [Client.Acquire] that has waited
// longer than [LongWait] for a lock: who holds it and until when, so that
// a wait behind a crashed holder's lease is seen while it lasts.
type LongWaitObserver interface {
	OnLongWait(ctx context.Context, e LongWaitEvent)
}

// RenewObserver is told the outcome of every watchdog renewal.
type RenewObserver interface {
	OnRenew(ctx context.Context, e RenewEvent)
}

// LossObserver is told when a lock is lost or reaches its max-hold limit.
type LossObserver interface {
	OnLoss(ctx context.Context, e LossEvent)
}

// ReleaseObserver is told the outcome of every release, by
// [Lock.Release] or by [Client.Close].
type ReleaseObserver interface {
	OnRelease(ctx context.Context, e ReleaseEvent)
}

// AcquireEvent is the outcome of one acquisition call.
type AcquireEvent struct {
	Name   string
	Token  int64  // 0 when not acquired
	Holder string // the holder id asked for (default ids: the one made for the call)
	// Duration is the whole call; Waited the part of it spent waiting for
	// another holder (0 when the first attempt decided).
	Duration, Waited time.Duration
	// Reacquired is true when the lock was already held by this holder id
	// ([WithHolder]): the token is the existing one, the lease restarted.
	Reacquired bool
	// Remaining is the other holder's remaining lease seen by the last
	// attempt, when the lock was held (-1: the key has no expiry).
	Remaining time.Duration
	// Err is nil when acquired; otherwise the call's error (it matches
	// [ErrNotAcquired] when the lock was held or the wait ended).
	Err error
}

// WaitEvent: an Acquire found the lock held and waits.
type WaitEvent struct {
	Name string
	// Remaining is the holder's remaining lease seen by the last attempt
	// (0 when this waiter queued behind others of its client without an
	// attempt; -1: no expiry).
	Remaining time.Duration
}

// LongWaitEvent: an Acquire has waited longer than [LongWait].
type LongWaitEvent struct {
	Name string
	// Waited is how long the call has waited so far.
	Waited time.Duration
	// Holder and Token are the lock's holder when the waiter looked (a
	// default holder id names its process: see [WithHolder]); "" and 0
	// when the lock was free (being handed over) or could not be read.
	Holder string
	Token  int64
	// Until is when the holder's lease runs out unless it is renewed
	// (local clock; zero when not held or with no expiry).
	Until time.Time
	// Err is why the lock could not be read, else nil.
	Err error
}

// RenewEvent is the outcome of one renewal of one lock.
type RenewEvent struct {
	Name  string
	Token int64
	// Duration is the renewal round trip (one pipeline for all the locks
	// renewed together).
	Duration time.Duration
	// Deadline is the lock's local deadline ([Lock.Deadline]) afterwards.
	Deadline time.Time
	// Err is nil when renewed. Otherwise the renewal failed transiently
	// and is retried while the deadline allows; a renewal that finds the
	// lock gone or taken is reported as a [LossEvent] instead.
	Err error
}

// LossEvent: a lock was lost, or reached its max-hold limit.
type LossEvent struct {
	Name  string
	Token int64
	// Held is how long the lock was held.
	Held time.Duration
	// Err is the cause, as [Lock.Err] returns it: a [*LostError] (it
	// matches [ErrLockLost]) with the reason, or [ErrMaxHold].
	Err error
}

// ReleaseEvent is the outcome of one release.
type ReleaseEvent struct {
	Name  string
	Token int64
	// Held is how long the lock was held.
	Held time.Duration
	// Duration is the release call (for [Client.Close], its one pipelined
	// round trip for all the locks it releases).
	Duration time.Duration
	// Err is nil when the lock was deleted; otherwise the release error
	// (e.g. [ErrNotHeld]).
	Err error
}

func isObserver(o Observer) bool {
	switch o.(type) {
	case AcquireObserver, WaitObserver, LongWaitObserver, RenewObserver, LossObserver, ReleaseObserver:
		return true
	}
	return false
}

// observers dispatches events to the observers that want them. Built once
// per client; an empty list costs one length check per event.
type observers struct {
	acquire []AcquireObserver
	wait    []WaitObserver
	long    []LongWaitObserver
	renew   []RenewObserver
	loss    []LossObserver
	release []ReleaseObserver
}

func newObservers(cfg config) *observers {
	all := cfg.observers
	if cfg.logSet {
		all = append(all[:len(all):len(all)], slogObserver{cfg.logger})
	}
	o := &observers{}
	for _, x := range all {
		if v, ok := x.(AcquireObserver); ok {
			o.acquire = append(o.acquire, v)
		}
		if v, ok := x.(WaitObserver); ok {
			o.wait = append(o.wait, v)
		}
		if v, ok := x.(LongWaitObserver); ok {
			o.long = append(o.long, v)
		}
		if v, ok := x.(RenewObserver); ok {
			o.renew = append(o.renew, v)
		}
		if v, ok := x.(LossObserver); ok {
			o.loss = append(o.loss, v)
		}
		if v, ok := x.(ReleaseObserver); ok {
			o.release = append(o.release, v)
		}
	}
	return o
}

func (o *observers) onAcquire(ctx context.Context, e AcquireEvent) {
	for _, x := range o.acquire {
		x.OnAcquire(ctx, e)
	}
}

func (o *observers) onWait(ctx context.Context, e WaitEvent) {
	for _, x := range o.wait {
		x.OnWait(ctx, e)
	}
}

func (o *observers) onLongWait(ctx context.Context, e LongWaitEvent) {
	for _, x := range o.long {
		x.OnLongWait(ctx, e)
	}
}

func (o *observers) onRenew(ctx context.Context, e RenewEvent) {
	for _, x := range o.renew {
		x.OnRenew(ctx, e)
	}
}

func (o *observers) onLoss(ctx context.Context, e LossEvent) {
	for _, x := range o.loss {
		x.OnLoss(ctx, e)
	}
}

func (o *observers) onRelease(ctx context.Context, e ReleaseEvent) {
	for _, x := range o.release {
		x.OnRelease(ctx, e)
	}
}

// slogObserver is [WithLogger]: one line per renewal failure and per loss,
// saying why, with durations as durations.
type slogObserver struct{ l *slog.Logger }

func (s slogObserver) OnRenew(ctx context.Context, e RenewEvent) {
	if e.Err == nil {
		return
	}
	s.l.LogAttrs(ctx, slog.LevelWarn, "fence: renewal failed, will retry until the deadline",
		slog.String("name", e.Name), slog.Int64("token", e.Token), slog.Duration("rtt", e.Duration),
		slog.Duration("deadline_in", time.Until(e.Deadline).Round(time.Millisecond)), slog.String("err", e.Err.Error()))
}

func (s slogObserver) OnLoss(ctx context.Context, e LossEvent) {
	attrs := []slog.Attr{slog.String("name", e.Name), slog.Int64("token", e.Token),
		slog.Duration("held", e.Held.Round(time.Millisecond))}
	if le, ok := e.Err.(*LostError); ok {
		attrs = append(attrs, slog.String("reason", le.Reason.String()))
		if le.TakenBy != "" {
			attrs = append(attrs, slog.String("taken_by", le.TakenBy), slog.Int64("taken_token", le.TakenToken))
		}
		if le.LastErr != nil {
			attrs = append(attrs, slog.String("last_err", le.LastErr.Error()))
		}
	} else {
		attrs = append(attrs, slog.String("reason", e.Err.Error()))
	}
	s.l.LogAttrs(ctx, slog.LevelWarn, "fence: lock lost", attrs...)
}
