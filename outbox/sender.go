package outbox

import (
	"context"
	"net/http"
	"time"
)

// Delivery is one attempt at delivering an effect, as a Sender gets it.
type Delivery struct {
	// ID is the outbox row's id: unique while the row exists.
	ID int64
	// Resource, Token and Holder are the fence of the transaction that
	// recorded the effect.
	Resource string
	Token    int64
	Holder   string
	// Destination, Key, Payload and Header are the Effect's.
	Destination string
	Key         string
	Payload     []byte
	Header      http.Header
	// Ordered is the Effect's: this is the oldest live ordered effect of
	// its resource.
	Ordered bool
	// Attempt counts from 1.
	Attempt int
	// Recorded is when the transaction recorded the effect (its commit
	// round trip), by the database's clock.
	Recorded time.Time
}

// Sender delivers effects. Send returns nil once the receiver has the
// effect, an error otherwise: wrapped guard.ErrAlreadyApplied when the
// receiver says it had the effect before (a redelivery: the row is
// deleted, as delivered), wrapped ErrTerminal for one that can never
// succeed (the row goes dead at once), wrapped ErrSuperseded for one the
// receiver refused as stale (the row is deleted), anything else to retry
// with backoff. ctx carries the relay's per-send timeout; a Send that
// panics or overruns it counts as a failed attempt, and the relay goes on.
//
// Send is called from many goroutines at once, and more than once for the
// same effect when a relay dies or a send times out: the receiver must
// deduplicate by Key (see [Receive]).
type Sender interface {
	Send(ctx context.Context, d Delivery) error
}

// SenderFunc is a function that is a Sender.
type SenderFunc func(ctx context.Context, d Delivery) error

// Send calls f.
func (f SenderFunc) Send(ctx context.Context, d Delivery) error { return f(ctx, d) }
