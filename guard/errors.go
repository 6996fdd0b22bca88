package guard

import (
	"errors"
	"fmt"
)

var (
	// ErrStaleToken is returned by Exec (as a *StaleTokenError when the
	// store reports the current token, as pgfence does) when
	// the store has already seen a higher token for the resource, or the
	// same token from another holder: another holder took over, and nothing
	// of this transaction is committed. Do not retry with the same token.
	ErrStaleToken = errors.New("guard: stale fencing token")

	// ErrAlreadyApplied is returned by Exec with WithKey when the key was
	// applied before for the resource (by this or an earlier holder): fn did
	// not run and nothing was written.
	ErrAlreadyApplied = errors.New("guard: idempotency key already applied")

	// ErrLeaseLost is returned by Exec when the lease reports that it is
	// lost (its Done channel is closed) before the transaction starts or
	// before it commits; the transaction is rolled back. It is joined with
	// the lease's Err() when the lease has one. A commit already sent is
	// not interrupted by the loss; if it fails anyway (e.g. the store
	// refused the claim), ErrLeaseLost is joined with the store's error.
	ErrLeaseLost = errors.New("guard: lease lost")

	// ErrInvalidLease is returned by Exec for a nil lease, an empty name,
	// a token <= 0 or an empty holder; nothing is written.
	ErrInvalidLease = errors.New("guard: invalid lease")

	// ErrInvalidOption is returned by Exec for a bad option (such as an
	// empty idempotency key); nothing is written.
	ErrInvalidOption = errors.New("guard: invalid option")

	// ErrNilStore is returned by Exec for a nil store.
	ErrNilStore = errors.New("guard: nil store: pass a store such as *pgfence.Store")

	// ErrNilFunc is returned by Exec for a nil fn.
	ErrNilFunc = errors.New("guard: nil fn: pass the function that does the writes")
)

// StaleTokenError is the error of a rejected claim: Token was presented for
// Resource, but the store had already seen Current (higher, or equal from
// another holder). errors.Is(err, ErrStaleToken) holds.
type StaleTokenError struct {
	Resource string
	Token    int64
	Current  int64
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("guard: stale fencing token %d for resource %q: the store has seen token %d; another holder took over, nothing was written", e.Token, e.Resource, e.Current)
}

// Unwrap returns ErrStaleToken.
func (e *StaleTokenError) Unwrap() error { return ErrStaleToken }
