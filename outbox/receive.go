package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/fencelock/fencelock/guard"
)

// Lease is the fence of the transaction that recorded a delivery, read
// back from its headers by [ReadHeaders]. It is a guard.Lease, so a
// receiver that runs guard.Exec with it on its own database refuses any
// delivery older than one it has applied for the same resource.
type Lease struct {
	resource string
	token    int64
	holder   string
}

var _ guard.Lease = Lease{}

// Name returns the resource (Fencing-Resource).
func (l Lease) Name() string { return l.resource }

// Token returns the fencing token (Fencing-Token).
func (l Lease) Token() int64 { return l.token }

// Holder returns the holder (Fencing-Holder).
func (l Lease) Holder() string { return l.holder }

// ReadHeaders reads a delivery's fencing headers: the lease of the
// transaction that recorded it and its Idempotency-Key. A missing or
// malformed header is ErrBadDelivery, naming it.
func ReadHeaders(h http.Header) (Lease, string, error) {
	get := func(name string) (string, error) {
		v := h.Values(name)
		switch {
		case len(v) == 0 || v[0] == "":
			return "", fmt.Errorf("%w: header %s missing (sent by outbox.HTTPSender)", ErrBadDelivery, name)
		case len(v) > 1:
			return "", fmt.Errorf("%w: header %s given %d times", ErrBadDelivery, name, len(v))
		}
		return v[0], nil
	}
	var l Lease
	var err error
	if l.resource, err = get(HeaderFencingResource); err != nil {
		return Lease{}, "", err
	}
	if l.holder, err = get(HeaderFencingHolder); err != nil {
		return Lease{}, "", err
	}
	tok, err := get(HeaderFencingToken)
	if err != nil {
		return Lease{}, "", err
	}
	if l.token, err = strconv.ParseInt(tok, 10, 64); err != nil || l.token <= 0 {
		return Lease{}, "", fmt.Errorf("%w: header %s is %q, not a token > 0", ErrBadDelivery, HeaderFencingToken, tok)
	}
	key, err := get(HeaderIdempotencyKey)
	if err != nil {
		return Lease{}, "", err
	}
	if len(key) > MaxKeyLen {
		return Lease{}, "", fmt.Errorf("%w: header %s is %d bytes, the limit is %d", ErrBadDelivery, HeaderIdempotencyKey, len(key), MaxKeyLen)
	}
	if _, err := guard.NewClaim(l); err != nil {
		return Lease{}, "", fmt.Errorf("%w: %w", ErrBadDelivery, err)
	}
	return l, key, nil
}

// Status is the HTTP status a receiver answers for err, the outcome of
// applying a delivery (what [Receive] answers, for receivers of your own):
//
//   - nil, and guard.ErrAlreadyApplied (a redelivery): 200, the sender is
//     done (a receiver of your own also sets [HeaderFencingOutcome] to
//     already_applied on such a 200, as Receive does, for the relay to
//     count it as such);
//   - guard.ErrRunFinished, which matches guard.ErrAlreadyApplied: 200 as
//     already applied too. A finished run is a no-op for every holder,
//     newer ones included: the receiver's work that the delivery belongs
//     to is done, which says nothing of a newer token;
//   - guard.ErrStaleToken: 409, refused for good (a newer holder's write
//     is there);
//   - ErrBadDelivery: 400; ErrTerminal: 422 (both terminal at the sender);
//   - anything else: 503, retried with backoff.
func Status(err error) int {
	switch {
	case err == nil:
		return http.StatusOK
	case errors.Is(err, guard.ErrStaleToken):
		return http.StatusConflict
	case errors.Is(err, guard.ErrAlreadyApplied): // guard.ErrRunFinished too
		return http.StatusOK
	case errors.Is(err, ErrBadDelivery):
		return http.StatusBadRequest
	case errors.Is(err, ErrTerminal):
		return http.StatusUnprocessableEntity
	}
	return http.StatusServiceUnavailable
}

// Receive returns a handler that applies each delivery at most once and
// never after a newer one of the same resource: it reads the fencing
// headers, then runs apply in guard.Exec on store with the delivery's
// lease and guard.WithKey(Idempotency-Key) (opts are added), and answers
// with Status: 200 applied or already applied (a key applied before, a run
// finished; then with the header Fencing-Outcome: already_applied), 409
// stale, 400 without fencing headers, 413 for a body over MaxPayload, 503
// to be retried.
// apply returns an error wrapping ErrTerminal to refuse a delivery for
// good (422).
//
// A delivery applied before is answered 200 as long as the store keeps its
// key: prune keys (pgfence's Prune) only after the longest redelivery
// delay of the relays that send here (Relay.MaxRedeliveryDelay).
func Receive[Tx any](store guard.Store[Tx], apply func(ctx context.Context, tx Tx, d Delivery) error, opts ...guard.Option) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := receive(r, store, apply, opts)
		code := Status(err)
		if errors.Is(err, errTooLarge) {
			code = http.StatusRequestEntityTooLarge
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		// Only a 200 says already applied: the relay reads the header on a
		// 2xx alone.
		if code == http.StatusOK && errors.Is(err, guard.ErrAlreadyApplied) {
			w.Header().Set(HeaderFencingOutcome, string(guard.ReasonAlreadyApplied))
		}
		w.WriteHeader(code)
		if err != nil {
			_, _ = io.WriteString(w, strings.ReplaceAll(err.Error(), "\n", " ")+"\n")
		}
	})
}

var errTooLarge = fmt.Errorf("%w: body over MaxPayload (%d bytes)", ErrTerminal, MaxPayload)

func receive[Tx any](r *http.Request, store guard.Store[Tx], apply func(context.Context, Tx, Delivery) error, opts []guard.Option) error {
	lease, key, err := ReadHeaders(r.Header)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxPayload+1))
	if err != nil {
		return fmt.Errorf("outbox: read the body: %w", err)
	}
	if len(body) > MaxPayload {
		return errTooLarge
	}
	header := r.Header.Clone()
	for name := range reserved {
		header.Del(name)
	}
	d := Delivery{
		Resource: lease.resource, Token: lease.token, Holder: lease.holder,
		Destination: r.URL.String(), Key: key, Payload: body, Header: header,
	}
	_, err = guard.Exec(r.Context(), store, lease, func(ctx context.Context, tx Tx) error {
		return apply(ctx, tx, d)
	}, append([]guard.Option{guard.WithKey(key)}, opts...)...)
	return err
}
