package fence

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrNotAcquired is returned by [Client.TryAcquire] when another holder
	// has the lock, and by [Client.Acquire] and [Client.Do] when the wait
	// ended (joined with the context's error, or with the wait limit's), or
	// when replica sync failed (inside a [*ReplicaSyncError]).
	ErrNotAcquired = errors.New("fence: lock not acquired")

	// ErrNotHeld is returned by [Lock.Release] and [Lock.Refresh] when the
	// lock is no longer ours on the server (it expired, was deleted, or
	// another holder has it), and by a second Release of the same lock.
	ErrNotHeld = errors.New("fence: lock not held")

	// ErrLockLost is the cause of a lock's context (see [Lock.Err]) when a
	// renewal found the lock gone or held by someone else, or when renewals
	// failed until the local lease deadline passed.
	ErrLockLost = errors.New("fence: lock lost")

	// ErrMaxHold is the cause of a lock's context (see [Lock.Err]) when the
	// max-hold limit ([WithMaxHold]) was reached and the watchdog stopped
	// renewing it.
	ErrMaxHold = errors.New("fence: max hold time reached")

	// ErrReleased is the cause of a lock's context (see [Lock.Err]) after
	// [Lock.Release].
	ErrReleased = errors.New("fence: lock released")

	// ErrClosed is returned by every call on a [Client] after
	// [Client.Close], and is the cause of the context of a lock that Close
	// released.
	ErrClosed = errors.New("fence: client closed")

	// ErrInvalidName is returned by [Client.Acquire], [Client.TryAcquire]
	// and [Client.Do] for a lock name that cannot be used; the message says
	// why.
	ErrInvalidName = errors.New("fence: invalid lock name")

	// ErrInvalidOption is returned by [New], [Client.Acquire],
	// [Client.TryAcquire], [Client.Do] and [Lock.Refresh] for an option
	// value that cannot be used; the message says which and why.
	ErrInvalidOption = errors.New("fence: invalid option")
)

// ReplicaSyncError is returned by [Client.Acquire], [Client.TryAcquire] and
// [Client.Do] when [WithReplicaSync] was asked for and fewer replicas than
// wanted acknowledged the acquisition in time. The lock was released again.
// It wraps [ErrNotAcquired].
type ReplicaSyncError struct {
	Name    string
	Want    int
	Got     int
	Timeout time.Duration
}

func (e *ReplicaSyncError) Error() string {
	return fmt.Sprintf("fence: lock %q: %d of %d replicas acknowledged within %v; lock released, not acquired",
		e.Name, e.Got, e.Want, e.Timeout)
}

// Unwrap makes errors.Is(err, ErrNotAcquired) true.
func (e *ReplicaSyncError) Unwrap() error { return ErrNotAcquired }

func invalidOption(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
}
