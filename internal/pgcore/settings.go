package pgcore

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/guard"
)

// Settings is what a Store's options set, the same for both stores.
type Settings struct {
	// LockTimeout and IdleTimeout are set for each guarded transaction
	// (lock_timeout, idle_in_transaction_session_timeout; 0: unset).
	LockTimeout time.Duration
	IdleTimeout time.Duration
	// Observers are reported every Exec through the Store and every run
	// step (guard.ObservedStore).
	Observers []guard.Observer
	// Unprepared makes pgfence send its statements unnamed on every
	// connection (pgfence.WithoutPreparedStatements; sqlfence's go through
	// the driver, which decides).
	Unprepared bool
}

// Option sets one of a Store's Settings. The stores wrap it in an Option
// interface of their own with an unexported method, so that their exported
// API names nothing of this package.
type Option = func(*Settings) error

// Apply runs opts on s in order through apply (a store's unexported
// method); a nil option is an error.
func Apply[O any](s *Settings, opts []O, apply func(O, *Settings) error) error {
	for _, o := range opts {
		if any(o) == nil {
			return fmt.Errorf("%w: nil Option", guard.ErrInvalidOption)
		}
		if err := apply(o, s); err != nil {
			return err
		}
	}
	return nil
}

// WithLockTimeout is the stores' WithLockTimeout.
func WithLockTimeout(d time.Duration) Option {
	return func(s *Settings) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: WithLockTimeout(%v): must be at least 1ms", guard.ErrInvalidOption, d)
		}
		s.LockTimeout = d
		return nil
	}
}

// WithIdleTimeout is the stores' WithIdleTimeout.
func WithIdleTimeout(d time.Duration) Option {
	return func(s *Settings) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: WithIdleTimeout(%v): must be at least 1ms", guard.ErrInvalidOption, d)
		}
		s.IdleTimeout = d
		return nil
	}
}

// WithObserver is the stores' WithObserver.
func WithObserver(o guard.Observer) Option {
	return func(s *Settings) error {
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
	}
}

// WithLogger is the stores' WithLogger: guard's log observer on l.
func WithLogger(l *slog.Logger) Option {
	return func(s *Settings) error {
		if l == nil {
			return fmt.Errorf("%w: WithLogger(nil): pass a logger, or omit the option", guard.ErrInvalidOption)
		}
		s.Observers = append(s.Observers[:len(s.Observers):len(s.Observers)], guard.NewLogObserver(l))
		return nil
	}
}

// Unprepared is pgfence's WithoutPreparedStatements.
func Unprepared() Option {
	return func(s *Settings) error {
		s.Unprepared = true
		return nil
	}
}
