package guard

import (
	"fmt"
	"strings"
)

// Option configures one Exec call; the With… functions of this package
// make them. Exec applies them in order and returns the first one's
// error, which matches ErrInvalidOption.
type Option interface {
	apply(*config) error
}

// optionFunc is an Option as a function.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	key       string
	observers []Observer
}

// WithKey makes the write idempotent: the store records idempotencyKey for
// the lease's resource in the same transaction, and if it was recorded
// before (by any holder), fn does not run and Exec returns
// ErrAlreadyApplied. An empty key is an error.
func WithKey(idempotencyKey string) Option {
	return optionFunc(func(c *config) error {
		if idempotencyKey == "" {
			return fmt.Errorf("%w: WithKey: empty idempotency key: pass a key that names the batch (e.g. \"sync-2026-11-30-batch-7\")", ErrInvalidOption)
		}
		if strings.IndexByte(idempotencyKey, 0) >= 0 {
			return fmt.Errorf("%w: WithKey: idempotency key contains a NUL byte", ErrInvalidOption)
		}
		c.key = idempotencyKey
		return nil
	})
}
