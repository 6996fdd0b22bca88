package outbox

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalidEffect is returned by Add for an effect it refuses (empty
	// destination or key, a payload or headers over the limits, headers
	// that are not valid HTTP). Nothing is recorded, and the transaction
	// is left as it was: fn decides whether to return the error.
	ErrInvalidEffect = errors.New("outbox: invalid effect")

	// ErrNotGuarded is matched by the error of Add and Notify when tx is
	// not the transaction of a running guard.Exec (pgfence or sqlfence),
	// or that transaction has ended. Nothing is recorded.
	ErrNotGuarded = errors.New("outbox: not an open guarded transaction")

	// ErrInvalidOption is returned by NewRelay for a bad option, and by
	// List and Backlog for a bad limit.
	ErrInvalidOption = errors.New("outbox: invalid option")

	// ErrNilDB is returned by NewRelay and the operator calls for a nil DB.
	ErrNilDB = errors.New("outbox: nil DB: pass a *pgxpool.Pool")

	// ErrNilSender is returned by NewRelay for a nil Sender.
	ErrNilSender = errors.New("outbox: nil Sender: pass one, such as &outbox.HTTPSender{}")

	// ErrTerminal marks a delivery that can never succeed (a receiver's
	// 4xx other than 409, a destination the sender cannot use): the relay
	// marks its row dead at once, with the reason, instead of retrying.
	// A Sender returns it wrapped, e.g. with [Terminal].
	ErrTerminal = errors.New("outbox: delivery refused for good")

	// ErrSuperseded marks a delivery the receiver refused because it has
	// seen a newer fencing token for the resource (HTTP 409): a newer
	// holder's effect overtook it. Retrying cannot change that; the relay
	// deletes the row and counts it (RelayStats.Superseded).
	ErrSuperseded = errors.New("outbox: delivery superseded: the receiver has seen a newer fencing token")

	// ErrBadDelivery is returned by ReadHeaders for a request without
	// valid fencing headers; Status answers it with 400.
	ErrBadDelivery = errors.New("outbox: not a fenced delivery")
)

// Terminal wraps err so that the relay marks the delivery dead at once
// (see ErrTerminal).
func Terminal(err error) error {
	if err == nil {
		return ErrTerminal
	}
	return fmt.Errorf("%w: %w", ErrTerminal, err)
}

// notGuardedError says why tx is not an open guarded transaction (the
// store core's words) and matches ErrNotGuarded.
type notGuardedError struct{ err error }

func (e *notGuardedError) Error() string        { return "outbox: " + e.err.Error() }
func (e *notGuardedError) Is(target error) bool { return target == ErrNotGuarded }
func (e *notGuardedError) Unwrap() error        { return e.err }
