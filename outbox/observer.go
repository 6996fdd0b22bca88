package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/fencelock/fencelock/guard"
)

// Observer receives a relay's events, e.g. to feed metrics or traces
// ([WithObserver]; package fencelockotel has one). It is any value that
// implements one or more of the event interfaces [ClaimObserver],
// [DeliveryObserver], [RecordObserver] and [ErrorObserver]; the relay
// calls only those it implements. A new kind of event comes as a new
// interface, and a new detail as a new field of its event struct, so an
// observer written today keeps compiling.
//
// Methods are called synchronously by the relay's loop, one goroutine of
// Run, right after the event (a failure of WithListen's connection, which
// a goroutine of its own notices, is handed to the loop and reported from
// there): one method at a time, so an observer of one relay needs no lock
// of its own. They must be fast and must not call back into the Relay.
// The ctx they get carries the values of Run's ctx, never its
// cancellation.
type Observer any

// ClaimObserver is told of every claim that succeeded, including those
// that found nothing due. A claim that failed is an [ErrorEvent].
type ClaimObserver interface {
	OnClaim(ctx context.Context, e ClaimEvent)
}

// DeliveryObserver is told the outcome of every attempt at delivering an
// effect: one event per Send, once the relay has decided what follows.
type DeliveryObserver interface {
	OnDelivery(ctx context.Context, e DeliveryEvent)
}

// RecordObserver is told of every statement that recorded outcomes in the
// database. A record that failed is an [ErrorEvent].
type RecordObserver interface {
	OnRecord(ctx context.Context, e RecordEvent)
}

// ErrorObserver is told of every database error the relay meets and waits
// through (it logs them too). Errors that end Run are its return value,
// not events; a relay's own stop is neither.
type ErrorObserver interface {
	OnRelayError(ctx context.Context, e ErrorEvent)
}

// Op names what a relay was doing in the database.
type Op string

const (
	// OpReady: Run's first check that the database has the outbox.
	OpReady Op = "ready"
	// OpClaim: claiming due rows.
	OpClaim Op = "claim"
	// OpAck: deleting the rows of delivered effects (delivered, already
	// applied, superseded).
	OpAck Op = "ack"
	// OpRetry: recording failed attempts (rows rescheduled or dead).
	OpRetry Op = "retry"
	// OpListen: the LISTEN connection of WithListen.
	OpListen Op = "listen"
)

// ClaimEvent is one claim of due rows.
type ClaimEvent struct {
	// Claimed is how many rows the claim took (0 when none was due), at
	// most Limit.
	Claimed int
	// Limit is how many it asked for: the batch size, or less when fewer
	// send slots were free.
	Limit int
	// Duration is the claim's statement.
	Duration time.Duration
}

// DeliveryOutcome is what became of one attempt at delivering an effect.
type DeliveryOutcome uint8

const (
	// Delivered: Send returned nil; the row is deleted.
	Delivered DeliveryOutcome = iota + 1
	// AlreadyApplied: the receiver had applied the effect before (Send
	// returned guard.ErrAlreadyApplied: a redelivery; or
	// guard.ErrRunFinished, which matches it: the receiver's run that the
	// effect belongs to is finished); the row is deleted, as delivered.
	AlreadyApplied
	// Superseded: the receiver refused the effect for good because it has
	// seen a newer fencing token (ErrSuperseded, HTTP 409); the row is
	// deleted. Not a failure of the relay: the fence doing its job.
	Superseded
	// Retried: the attempt failed and the effect is sent again after a
	// backoff.
	Retried
	// Dead: the attempt failed for good (ErrTerminal) or was the last one
	// allowed (WithMaxAttempts); the row is dead until requeued.
	Dead
)

// String returns delivered, already_applied, superseded, retried or dead
// (a metric attribute value).
func (o DeliveryOutcome) String() string {
	switch o {
	case Delivered:
		return "delivered"
	case AlreadyApplied:
		return "already_applied"
	case Superseded:
		return "superseded"
	case Retried:
		return "retried"
	case Dead:
		return "dead"
	}
	return "invalid"
}

// DeliveryEvent is the outcome of one Send.
type DeliveryEvent struct {
	// ID, Resource, Token, Holder, Destination, Key and Attempt are the
	// Delivery's.
	ID          int64
	Resource    string
	Token       int64
	Holder      string
	Destination string
	Key         string
	Attempt     int
	// Recorded is when the transaction recorded the effect, by the
	// database's clock: the time from it to the event is how long the
	// effect waited for its delivery (give or take the clocks' skew).
	Recorded time.Time
	Outcome  DeliveryOutcome
	// Duration is the Send, bounded by the send timeout.
	Duration time.Duration
	// Err is Send's error: nil when Delivered.
	Err error
}

// RecordEvent is one statement that recorded outcomes.
type RecordEvent struct {
	// Op is OpAck or OpRetry.
	Op Op
	// Outcomes is how many outcomes the statement recorded.
	Outcomes int
	// Changed is how many rows it changed: fewer than Outcomes when the
	// claim of a row had expired and another relay had claimed it (that
	// relay sends it again).
	Changed int
	// Duration is the statement.
	Duration time.Duration
}

// ErrorEvent is a database error the relay waits through.
type ErrorEvent struct {
	// Op is what the relay was doing.
	Op Op
	// Err is the error, as logged.
	Err error
	// Failures counts the errors in a row of the relay's loop (claims and
	// records; OpReady and OpListen count their own), 1 for the first.
	Failures int
}

func isObserver(o Observer) bool {
	switch o.(type) {
	case ClaimObserver, DeliveryObserver, RecordObserver, ErrorObserver:
		return true
	}
	return false
}

// WithObserver adds o to the relay's observers. o must implement at least
// one of the event interfaces listed at [Observer]; each call of the
// option adds one.
func WithObserver(o Observer) RelayOption {
	return relayOption(func(c *relayConfig) error {
		if o == nil {
			return invalid("WithObserver(nil): pass an observer, or omit the option")
		}
		if !isObserver(o) {
			return invalid("WithObserver(%T): it implements none of the observer interfaces (ClaimObserver, DeliveryObserver, RecordObserver, ErrorObserver)", o)
		}
		c.observers = append(c.observers, o)
		return nil
	})
}

// observers dispatches events to the observers that want them. Built once
// per relay; without observers an event costs a length check.
type observers struct {
	claim    []ClaimObserver
	delivery []DeliveryObserver
	record   []RecordObserver
	err      []ErrorObserver
}

func newObservers(all []Observer) observers {
	var o observers
	for _, x := range all {
		if v, ok := x.(ClaimObserver); ok {
			o.claim = append(o.claim, v)
		}
		if v, ok := x.(DeliveryObserver); ok {
			o.delivery = append(o.delivery, v)
		}
		if v, ok := x.(RecordObserver); ok {
			o.record = append(o.record, v)
		}
		if v, ok := x.(ErrorObserver); ok {
			o.err = append(o.err, v)
		}
	}
	return o
}

func (o *observers) onClaim(ctx context.Context, e ClaimEvent) {
	for _, x := range o.claim {
		x.OnClaim(ctx, e)
	}
}

func (o *observers) onDelivery(ctx context.Context, e DeliveryEvent) {
	for _, x := range o.delivery {
		x.OnDelivery(ctx, e)
	}
}

func (o *observers) onRecord(ctx context.Context, e RecordEvent) {
	for _, x := range o.record {
		x.OnRecord(ctx, e)
	}
}

func (o *observers) onError(ctx context.Context, e ErrorEvent) {
	for _, x := range o.err {
		x.OnRelayError(ctx, e)
	}
}

// outcome is what the relay makes of a Send's error on the given attempt.
func (c *relayConfig) outcome(err error, attempt int) DeliveryOutcome {
	switch {
	case err == nil:
		return Delivered
	case errors.Is(err, guard.ErrAlreadyApplied): // guard.ErrRunFinished too: its work is done
		return AlreadyApplied
	case errors.Is(err, ErrSuperseded):
		return Superseded
	case errors.Is(err, ErrTerminal) || attempt >= c.maxAttempts:
		return Dead
	}
	return Retried
}
