package pgstore

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/guard"
)

// Option configures a Postgres store: pass it to pgfence.New or
// sqlfence.New. The With… functions of this package make them; New applies
// them in order and returns the first one's error, which matches
// guard.ErrInvalidOption.
type Option interface {
	apply(*Settings) error
}

// option is an Option as a function.
type option func(*Settings) error

func (o option) apply(s *Settings) error { return o(s) }

// Settings is what a list of options comes to. A store reads it once, in
// New.
type Settings struct {
	// LockTimeout and IdleTimeout are set for each guarded transaction
	// (lock_timeout, idle_in_transaction_session_timeout); 0 leaves the
	// server's setting.
	LockTimeout time.Duration
	IdleTimeout time.Duration
	// Observers are reported every guard.Exec through the store and every
	// run step (guard.ObservedStore), and Advance to those that are
	// guard.AdvanceObservers.
	Observers []guard.Observer
	// Unprepared sends pgfence's statements unnamed on every connection.
	Unprepared bool
}

// Apply applies opts in order and returns the Settings they make, or the
// first one's error (a nil Option is one).
func Apply(opts ...Option) (Settings, error) {
	var s Settings
	for _, o := range opts {
		if o == nil {
			return Settings{}, fmt.Errorf("%w: nil Option", guard.ErrInvalidOption)
		}
		if err := o.apply(&s); err != nil {
			return Settings{}, err
		}
	}
	return s, nil
}

// WithLockTimeout bounds how long a guarded transaction waits for a lock:
// the claim at commit waiting for the resource's fence lock (held only by
// commits in flight, by Advance, and by transactions that wrote to a table
// protected with pgfence's Protect, such as a previous holder frozen after
// such a write), and the writes of fn. Past d the wait fails, for the
// fence lock with guard.ErrFenceBusy, instead of lasting until the other
// transaction ends; the transaction is rolled back. It is set for the
// transaction only (lock_timeout, set_config(..., true)) in the statement
// that checks the claim at begin, so it costs no round trip. d must be at
// least a millisecond. Default: Postgres's lock_timeout setting.
func WithLockTimeout(d time.Duration) Option {
	return timeout("WithLockTimeout", d, func(s *Settings) { s.LockTimeout = d })
}

// WithIdleTimeout makes Postgres end a guarded transaction's session when
// the transaction sits idle (no statement from the client) for longer than
// d: idle_in_transaction_session_timeout, set for the transaction only
// with the check at begin. A guarded transaction takes the fence lock only
// in its commit, so a holder frozen in the middle of it (SIGSTOP, VM
// freeze, partition) blocks no one, except after writing to a table
// protected with pgfence's Protect: the protect trigger holds the fence
// lock until the transaction ends, and the next holder's claim waits for
// it. With this option the database rolls such a frozen transaction back
// after d (and frees its connection and row locks). Pick d above the
// longest pause between two statements of a healthy fn, e.g. the lock's
// lease. d must be at least a millisecond. Default: off.
func WithIdleTimeout(d time.Duration) Option {
	return timeout("WithIdleTimeout", d, func(s *Settings) { s.IdleTimeout = d })
}

// timeout is the option name(d), which set applies: d is set on the
// server in milliseconds, so it must be at least one.
func timeout(name string, d time.Duration, set func(*Settings)) Option {
	return option(func(s *Settings) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: %s(%v): must be at least 1ms", guard.ErrInvalidOption, name, d)
		}
		set(s)
		return nil
	})
}

// WithObserver adds o to the store's observers: every guard.Exec through
// the store, and every Run.Step and Run.Finish, reports to it, and every
// Advance to those that are guard.AdvanceObservers (see guard.Observer; a
// metrics adapter, say). Set it once here rather than per call with
// guard.WithObserver; each call of the option adds one. o must implement
// at least one of guard's observer interfaces.
func WithObserver(o guard.Observer) Option {
	return option(func(s *Settings) error {
		if o == nil {
			return fmt.Errorf("%w: WithObserver(nil): pass an observer, or omit the option", guard.ErrInvalidOption)
		}
		_, exec := o.(guard.ExecObserver)
		_, adv := o.(guard.AdvanceObserver)
		if !exec && !adv {
			return fmt.Errorf("%w: WithObserver(%T): it implements none of guard's observer interfaces (guard.ExecObserver, guard.AdvanceObserver)", guard.ErrInvalidOption, o)
		}
		s.Observers = append(s.Observers[:len(s.Observers):len(s.Observers)], o)
		return nil
	})
}

// WithLogger logs every guarded write through the store to l, one line
// each (guard.NewLogObserver: committed at Debug, rejected and failed at
// Warn, unknown outcomes at Error). Default: no logging.
func WithLogger(l *slog.Logger) Option {
	return option(func(s *Settings) error {
		if l == nil {
			return fmt.Errorf("%w: WithLogger(nil): pass a logger, or omit the option", guard.ErrInvalidOption)
		}
		s.Observers = append(s.Observers[:len(s.Observers):len(s.Observers)], guard.NewLogObserver(l))
		return nil
	})
}

// WithoutPreparedStatements is pgfence's: it makes pgfence send its own
// statements unnamed (parsed and planned in every transaction) on every
// connection. By default pgfence prepares them once per connection when
// the connection goes straight to Postgres, which it tells by comparing
// the backend's pg_backend_pid() with the process id of the connection's
// cancel key (a transaction pooler such as PgBouncer hands out a key of
// its own), and sends them unnamed otherwise. Use this option behind a
// pooler that passes the server's cancel key through unchanged while it
// moves transactions between server connections. Parsing and planning
// them in every transaction costs the server more CPU per guarded
// transaction. sqlfence refuses it: there the database/sql driver decides
// how statements are sent.
func WithoutPreparedStatements() Option {
	return option(func(s *Settings) error {
		s.Unprepared = true
		return nil
	})
}
