package pgfence

import (
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/pgcore"
)

var (
	_ guard.ObservedStore = (*Store)(nil)
	_ guard.ObservedStore = runStore{}
)

// WithObserver adds o to the Store's observers: every guard.Exec through
// the Store, and every Run.Step and Run.Finish, reports to it (see
// guard.Observer; a metrics adapter, guard.NewLogObserver). Set it once
// here rather than per call with guard.WithObserver; each call of the
// option adds one. o must implement at least one of guard's observer
// interfaces.
func WithObserver(o guard.Observer) Option {
	return func(s *Store) error {
		if err := pgcore.CheckObserver(o); err != nil {
			return err
		}
		s.observers = append(s.observers[:len(s.observers):len(s.observers)], o)
		return nil
	}
}

// Observers returns the observers set with WithObserver
// (guard.ObservedStore: guard.Exec reports to them).
func (s *Store) Observers() []guard.Observer { return s.observers }

// Observers implements guard.ObservedStore for a run's steps.
func (rs runStore) Observers() []guard.Observer { return rs.s.observers }
