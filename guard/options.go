package guard

import (
	"fmt"
	"strings"
)

// Option configures one Exec call.
type Option func(*config) error

type config struct {
	key       string
	observers []Observer
}

// WithKey makes the write idempotent: the store records idempotencyKey for
// the lease's resource in the same transaction, and if it was recorded
// before (by any holder), fn does not run and Exec returns
// ErrAlreadyApplied. An empty key is an error.
func WithKey(idempotencyKey string) Option {
	return func(c *config) error {
		if idempotencyKey == "" {
			return fmt.Errorf("%w: WithKey: empty idempotency key: pass a key that names the batch (e.g. \"sync-2026-11-30-batch-7\")", ErrInvalidOption)
		}
		if strings.IndexByte(idempotencyKey, 0) >= 0 {
			return fmt.Errorf("%w: WithKey: idempotency key contains a NUL byte", ErrInvalidOption)
		}
		c.key = idempotencyKey
		return nil
	}
}
