package natsoutbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

// Receive applies one message a Sender published, on the consumer's own
// database, and acknowledges it: it reads the fencing headers
// (outbox.ReadHeaders), runs apply in guard.Exec on store with the
// message's lease and guard.WithKey(Idempotency-Key) (opts are added),
// then
//
//   - nil (applied now) or guard.ErrAlreadyApplied, guard.ErrRunFinished
//     included (applied before: a copy stored again after the duplicate
//     window, or redelivered after a lost ack; or its run is finished,
//     which is applied for good): Ack;
//   - guard.ErrStaleToken (a newer holder's effect for the resource was
//     applied), outbox.ErrBadDelivery (no valid fencing headers) or an
//     apply error wrapping outbox.ErrTerminal: Term, never redelivered;
//   - anything else: Nak, redelivered after a delay that doubles with each
//     delivery, from 1s up to a minute.
//
// It returns guard.Exec's error (or ReadHeaders'), joined with the
// acknowledgement's if that failed: an applied message whose Ack was lost
// comes again and is acked as already applied.
//
// A message is applied at most once as long as store keeps its key: prune
// keys there (pgfence's Prune, fencectl keys prune) only with an age above
// the longest time two copies of it can be delivered apart (see the
// package documentation).
func Receive[Tx any](ctx context.Context, store guard.Store[Tx], msg jetstream.Msg, apply func(ctx context.Context, tx Tx, d outbox.Delivery) error, opts ...guard.Option) error {
	err := receive(ctx, store, msg, apply, opts)
	var ackErr error
	switch outbox.Status(err) {
	case http.StatusOK:
		ackErr = msg.Ack()
	case http.StatusServiceUnavailable:
		ackErr = msg.NakWithDelay(nakDelay(msg))
	default:
		ackErr = msg.TermWithReason(oneLine(err.Error()))
	}
	if ackErr != nil {
		return errors.Join(err, fmt.Errorf("natsoutbox: acknowledge the message: %w", ackErr))
	}
	return err
}

func receive[Tx any](ctx context.Context, store guard.Store[Tx], msg jetstream.Msg, apply func(context.Context, Tx, outbox.Delivery) error, opts []guard.Option) error {
	h := http.Header(msg.Headers())
	lease, key, err := outbox.ReadHeaders(h)
	if err != nil {
		return err
	}
	header := make(http.Header, len(h))
	for name, values := range h {
		switch name {
		case outbox.HeaderIdempotencyKey, outbox.HeaderFencingToken, outbox.HeaderFencingResource, outbox.HeaderFencingHolder, HeaderMsgID:
		default:
			header[name] = values
		}
	}
	d := outbox.Delivery{
		Resource: lease.Name(), Token: lease.Token(), Holder: lease.Holder(),
		Destination: Scheme + msg.Subject(), Key: key, Payload: msg.Data(), Header: header,
	}
	_, err = guard.Exec(ctx, store, lease, func(ctx context.Context, tx Tx) error {
		return apply(ctx, tx, d)
	}, append([]guard.Option{guard.WithKey(key)}, opts...)...)
	return err
}

// nakDelay is 1s after the first delivery, doubling up to a minute.
func nakDelay(msg jetstream.Msg) time.Duration {
	n := uint64(1)
	if md, err := msg.Metadata(); err == nil && md.NumDelivered > 0 {
		n = md.NumDelivered
	}
	return min(time.Second<<min(n-1, 6), time.Minute)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
