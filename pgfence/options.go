package pgfence

import (
	"fmt"
	"time"

	"github.com/fencelock/fencelock/guard"
)

// Option configures a Store.
type Option func(*Store) error

// WithLockTimeout bounds how long a guarded transaction waits for a lock:
// the claim at commit waiting for the fence row (held only by commits in
// flight, by Advance, and by transactions that wrote to a table protected
// with Protect, such as a previous holder frozen after such a write), and
// the writes of fn. Past d the wait fails, for the fence row with
// guard.ErrFenceBusy, instead of lasting until the other transaction ends; the
// transaction is rolled back. It is set for the transaction only
// (set_config(..., true)) in the round trip of BEGIN. d must be at least a
// millisecond. Default: no limit (Postgres's lock_timeout setting
// applies).
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
// the transaction sits idle (no statement from the client) for longer than
// d: idle_in_transaction_session_timeout, set for the transaction only in
// the round trip of BEGIN. A guarded transaction takes the fence row lock
// only in its commit, so a holder frozen in the middle of it (SIGSTOP, VM
// freeze, partition) blocks no one, except after writing to a table
// protected with Protect: the protect trigger locks the fence row until
// the transaction ends, and the next holder's claim waits for it. With
// this option the database rolls such a frozen transaction back after d
// (and frees its connection and row locks). Pick d above the longest pause
// between two statements of a healthy fn, e.g. the lock's lease. d must be
// at least a millisecond. Default: off.
func WithIdleTimeout(d time.Duration) Option {
	return func(s *Store) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: WithIdleTimeout(%v): must be at least 1ms", guard.ErrInvalidOption, d)
		}
		s.idleTimeout = d
		return nil
	}
}

// WithoutPreparedStatements makes the Store send its own statements
// unnamed (parsed and planned in every transaction) on every connection.
// By default it prepares them once per connection when the connection goes
// straight to Postgres, which it tells by comparing the backend's
// pg_backend_pid() with the process id of the connection's cancel key (a
// transaction pooler such as PgBouncer hands out a key of its own), and
// sends them unnamed otherwise. Use this option behind a pooler that
// passes the server's cancel key through unchanged while it moves
// transactions between server connections. It costs the server about
// three times the CPU per guarded transaction.
func WithoutPreparedStatements() Option {
	return func(s *Store) error {
		s.prepare = false
		return nil
	}
}
