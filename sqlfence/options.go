package sqlfence

import (
	"fmt"
	"time"

	"github.com/fencelock/fencelock/guard"
)

// Option configures a Store.
type Option func(*Store) error

// WithLockTimeout bounds how long a guarded transaction waits for a lock:
// the fence row at commit (held only by commits in flight, by Advance, and
// by transactions that wrote to a table protected with pgfence's Protect)
// and the writes of fn. Past d the wait fails, for the fence row with
// guard.ErrFenceBusy, and the transaction is rolled back. It is set for the
// transaction only (lock_timeout, set_config local) in the statement that
// checks the claim at begin, so it costs no round trip. d must be at least
// a millisecond. Default: Postgres's lock_timeout setting.
func WithLockTimeout(d time.Duration) Option {
	return func(s *Store) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: WithLockTimeout(%v): must be at least 1ms", guard.ErrInvalidOption, d)
		}
		s.lockTimeout = d
		return nil
	}
}

// WithIdleTimeout makes Postgres end a guarded transaction's session when
// it sits idle (no statement from the client) for longer than d
// (idle_in_transaction_session_timeout, for the transaction only): a
// holder frozen after writing to a protected table then stops delaying the
// next holder after d. Pick d above the longest pause between two
// statements of a healthy fn, e.g. the lock's lease. d must be at least a
// millisecond. Default: off.
func WithIdleTimeout(d time.Duration) Option {
	return func(s *Store) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: WithIdleTimeout(%v): must be at least 1ms", guard.ErrInvalidOption, d)
		}
		s.idleTimeout = d
		return nil
	}
}
