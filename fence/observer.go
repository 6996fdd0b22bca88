package fence

import "time"

// Event describes one lock event for an [Observer].
type Event struct {
	Name  string
	Token int64 // 0 when no lock was acquired
	// Duration depends on the event: see each Observer method.
	Duration time.Duration
	// Err is the failure, when the event is one.
	Err error
}

// Observer receives lock events, e.g. to feed metrics. Methods are called
// synchronously, some from the client's watchdog goroutine: they must be
// fast and must not call back into the Client. Embed [NopObserver] to
// implement only some of them.
type Observer interface {
	// Acquired: a lock was acquired; Duration is the whole Acquire call.
	Acquired(Event)
	// Waited: an acquisition found the lock held and waited; Duration is
	// the time spent waiting, Err is nil when the wait ended in acquisition.
	Waited(Event)
	// Renewed: a renewal succeeded; Duration is its round trip.
	Renewed(Event)
	// RenewalFailed: a renewal failed transiently and will be retried
	// within the lease; Duration is the round trip, Err the failure.
	RenewalFailed(Event)
	// Lost: the lock was lost (Err is ErrLockLost or ErrMaxHold);
	// Duration is how long it was held.
	Lost(Event)
	// Released: the holder released the lock; Duration is how long it was
	// held, Err is the release error if any.
	Released(Event)
}

// NopObserver ignores every event; embed it to implement part of
// [Observer].
type NopObserver struct{}

func (NopObserver) Acquired(Event)      {}
func (NopObserver) Waited(Event)        {}
func (NopObserver) Renewed(Event)       {}
func (NopObserver) RenewalFailed(Event) {}
func (NopObserver) Lost(Event)          {}
func (NopObserver) Released(Event)      {}

var _ Observer = NopObserver{}
