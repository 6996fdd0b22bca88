package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Observer receives guarded-write events, e.g. to feed metrics, traces or
// logs. It is any value that implements one or more of the event
// interfaces ([ExecObserver]; [AdvanceObserver] for stores' Advance);
// guard and the stores call only those it implements.
// A new kind of event comes as a new interface, and a new detail as a new
// field of its event struct, so an observer written today keeps compiling.
//
// Observers are attached per call ([WithObserver]) or per store: a store
// that implements [ObservedStore] (pgstore.WithObserver) reports every
// Exec and every run step through it, which is the way to set them once.
//
// Methods are called synchronously by the goroutine that called Exec, after
// the outcome is known: they must be fast. The ctx they get carries the
// values of the Exec call (such as a trace span), never its cancellation.
type Observer any

// ExecObserver is told the outcome of every Exec that got past input
// validation (a bad lease or option is an error returned at once, not an
// event), including run steps of stores built on Exec.
type ExecObserver interface {
	OnExec(ctx context.Context, e ExecEvent)
}

// AdvanceObserver is told the outcome of every Advance of a store
// (pgfence.Store.Advance, sqlfence.Store.Advance) that got past input
// validation: Committed when the claim is recorded, Rejected with the
// reason (stale_token, read_only, lease_lost), or Failed. Stores report it
// to the observers of their WithObserver; Exec's own claim is part of its
// [ExecEvent], not an AdvanceEvent.
type AdvanceObserver interface {
	OnAdvance(ctx context.Context, e AdvanceEvent)
}

// AdvanceEvent is the outcome of one Advance. Outcome and Reason are
// [Classify]'s of Err.
type AdvanceEvent struct {
	Resource string
	Token    int64
	Holder   string
	Outcome  Outcome
	Reason   Reason
	// Duration is the whole call.
	Duration time.Duration
	// Err is Advance's error (nil when the claim was recorded).
	Err error
}

// ObservedStore is implemented by stores that carry observers of their own
// (pgstore.WithObserver): Exec reports to them, then to those of
// [WithObserver].
type ObservedStore interface {
	Observers() []Observer
}

// Outcome is how an Exec ended.
type Outcome uint8

const (
	// Committed: fn's writes are committed (err == nil).
	Committed Outcome = iota + 1
	// Rejected: the fence refused the write, by design: nothing was
	// committed and [ExecEvent.Reason] says why.
	Rejected
	// Failed: fn's error, a cancelled ctx, the store's error (nothing was
	// committed).
	Failed
	// Unknown: the write may or may not have committed
	// ([ErrUnknownOutcome], [ErrTxEnded]); Reason says which.
	Unknown
)

// String returns committed, rejected, failed or unknown (a metric
// attribute value).
func (o Outcome) String() string {
	switch o {
	case Committed:
		return "committed"
	case Rejected:
		return "rejected"
	case Failed:
		return "failed"
	case Unknown:
		return "unknown"
	}
	return "invalid"
}

// Reason names why an Exec was rejected or its outcome is unknown. The set
// is small and fixed, so it is safe as a metric attribute.
type Reason string

const (
	// ReasonStaleToken: the store has seen a newer token ([ErrStaleToken]).
	ReasonStaleToken Reason = "stale_token"
	// ReasonAlreadyApplied: the idempotency key was applied before
	// ([ErrAlreadyApplied]).
	ReasonAlreadyApplied Reason = "already_applied"
	// ReasonRunFinished: a step of a resumable run that is finished.
	ReasonRunFinished Reason = "run_finished"
	// ReasonLeaseLost: the lease was lost before the commit
	// ([ErrLeaseLost]) and the store did not refuse on its own.
	ReasonLeaseLost Reason = "lease_lost"
	// ReasonReadOnly: the database refuses writes (a hot standby, a
	// read-only default).
	ReasonReadOnly Reason = "read_only"
	// ReasonCommitInFlight: the connection was lost, or ctx ended, while
	// the commit was in flight ([ErrUnknownOutcome]).
	ReasonCommitInFlight Reason = "commit_in_flight"
	// ReasonTxEnded: fn ended the transaction itself ([ErrTxEnded]).
	ReasonTxEnded Reason = "tx_ended"
)

// ExecEvent is the outcome of one Exec.
type ExecEvent struct {
	// Resource, Token, Holder and Key are the claim's (Key "" for none).
	Resource string
	Token    int64
	Holder   string
	Key      string
	Outcome  Outcome
	// Reason is set for Rejected and Unknown ("" otherwise).
	Reason Reason
	// Duration is the whole Exec: begin, fn, commit.
	Duration time.Duration
	// Err is Exec's error (nil when committed).
	Err error
}

// WithObserver adds o to the observers of this Exec call (after the
// store's, see [ObservedStore]). o must implement at least one of the
// event interfaces listed at [Observer].
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return fmt.Errorf("%w: WithObserver(nil): pass an observer, or omit the option", ErrInvalidOption)
		}
		if !isObserver(o) {
			return fmt.Errorf("%w: WithObserver(%T): it implements none of the observer interfaces (ExecObserver)", ErrInvalidOption, o)
		}
		c.observers = append(c.observers[:len(c.observers):len(c.observers)], o)
		return nil
	})
}

// WithLogger logs this Exec call's outcome to l, one line (see
// [NewLogObserver]); the stores' WithLogger does it for every call. l
// must not be nil.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: WithLogger(nil): pass a logger, or omit the option", ErrInvalidOption)
		}
		c.observers = append(c.observers[:len(c.observers):len(c.observers)], NewLogObserver(l))
		return nil
	})
}

func isObserver(o Observer) bool {
	_, ok := o.(ExecObserver)
	return ok
}

// execObservers returns the ExecObservers of store and of the call, or
// nil for none (then Exec does not even read the clock).
func execObservers(store any, call []Observer) []ExecObserver {
	var all []Observer
	if s, ok := store.(ObservedStore); ok {
		all = s.Observers()
	}
	if len(all) == 0 && len(call) == 0 {
		return nil
	}
	var out []ExecObserver
	for _, list := range [][]Observer{all, call} {
		for _, o := range list {
			if e, ok := o.(ExecObserver); ok {
				out = append(out, e)
			}
		}
	}
	return out
}

// errPanicked stands for the error of an Exec whose fn panicked (the
// panic goes on to the caller).
var errPanicked = errors.New("guard: fn panicked (the panic was re-raised)")

// Classify returns the outcome and reason of Exec's error err (Committed
// for nil). Observers get the result in [ExecEvent]; it is exported for
// code that wraps Exec and wants the same names.
func Classify(err error) (Outcome, Reason) {
	switch {
	case err == nil:
		return Committed, ""
	case errors.Is(err, ErrUnknownOutcome):
		return Unknown, ReasonCommitInFlight
	case errors.Is(err, ErrTxEnded):
		return Unknown, ReasonTxEnded
	case errors.Is(err, ErrRunFinished):
		return Rejected, ReasonRunFinished
	case errors.Is(err, ErrReadOnly):
		return Rejected, ReasonReadOnly
	case errors.Is(err, ErrStaleToken):
		return Rejected, ReasonStaleToken
	case errors.Is(err, ErrAlreadyApplied):
		return Rejected, ReasonAlreadyApplied
	case errors.Is(err, ErrLeaseLost):
		return Rejected, ReasonLeaseLost
	}
	return Failed, ""
}

// report builds the event of a finished Exec and hands it to obs. A
// panicking fn leaves err nil and res empty: it is reported as failed.
func report(ctx context.Context, obs []ExecObserver, c Claim, start time.Time, res Result, err error) {
	if err == nil && res.Token == 0 {
		err = errPanicked
	}
	e := ExecEvent{Resource: c.Resource, Token: c.Token, Holder: c.Holder, Key: c.Key,
		Duration: time.Since(start), Err: err}
	e.Outcome, e.Reason = Classify(err)
	ctx = context.WithoutCancel(ctx)
	for _, o := range obs {
		o.OnExec(ctx, e)
	}
}

// NewLogObserver returns the observer that [WithLogger] and the stores'
// WithLogger install: it logs every Exec to l, one line each: committed at Debug, rejected and failed at Warn (a rejection is
// the fence doing its job, but someone should know a holder went stale),
// unknown outcomes at Error; durations as durations. A nil l is
// slog.Default().
func NewLogObserver(l *slog.Logger) ExecObserver {
	if l == nil {
		l = slog.Default()
	}
	return logObserver{l}
}

type logObserver struct{ l *slog.Logger }

func (s logObserver) OnExec(ctx context.Context, e ExecEvent) {
	level, msg := slog.LevelDebug, "guard: committed"
	switch e.Outcome {
	case Rejected:
		level, msg = slog.LevelWarn, "guard: rejected, nothing written"
	case Failed:
		level, msg = slog.LevelWarn, "guard: failed, nothing written"
	case Unknown:
		level, msg = slog.LevelError, "guard: commit outcome unknown"
	}
	if !s.l.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 7)
	attrs = append(attrs, slog.String("resource", e.Resource), slog.Int64("token", e.Token))
	if e.Key != "" {
		attrs = append(attrs, slog.String("key", e.Key))
	}
	if e.Reason != "" {
		attrs = append(attrs, slog.String("reason", string(e.Reason)))
	}
	attrs = append(attrs, slog.Duration("took", e.Duration))
	if e.Err != nil {
		attrs = append(attrs, slog.String("err", e.Err.Error()))
	}
	s.l.LogAttrs(ctx, level, msg, attrs...)
}
