package fence

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

var (
	// ErrNotAcquired is returned by [Client.TryAcquire] when another holder
	// has the lock, and by TryAcquire, [Client.Acquire], [Client.Do] and
	// [Election.Campaign] when ctx is done or the wait ended (the error then
	// also matches ctx's error, or the wait limit's), or when replica sync
	// failed (inside a [*ReplicaSyncError]); by Campaign also when its
	// candidate was cut off from Redis for its liveness.
	ErrNotAcquired = errors.New("fence: lock not acquired")

	// ErrNotHeld is returned by [Lock.Release] and [Lock.Refresh] when the
	// lock is no longer ours: on the server (it expired, was deleted, or
	// another holder has it), or locally (a second Release; a lock that
	// was released, lost, closed or reached its max hold, whose own error
	// — [Lock.Err] — the returned error matches too); and by
	// [Election.Proclaim] for such a term. Every method of a nil *Lock
	// that returns an error returns it.
	ErrNotHeld = errors.New("fence: lock not held")

	// ErrLockLost is matched by the cause of a lock's context (see
	// [Lock.Err], a [*LostError] that says why) when a renewal found the
	// lock gone or held by someone else, when renewals failed until the
	// local lease deadline passed, or when a fixed lease ran out.
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

	// ErrInvalidName is returned by [Client.Acquire], [Client.TryAcquire],
	// [Client.Do] and [Client.Election] for a name that cannot be used; the
	// message says why.
	ErrInvalidName = errors.New("fence: invalid lock name")

	// ErrNoLeader is returned by [Election.Leader] when the election has
	// no leader: no term holds its lock (the message says how the last
	// term known ended).
	ErrNoLeader = errors.New("fence: no leader")

	// ErrInvalidOption is returned by [New], [Client.Acquire],
	// [Client.TryAcquire], [Client.Do], [Lock.Refresh], [Client.Election],
	// [Election.Campaign] and [Election.Proclaim] for an option or value
	// that cannot be used; the message says which and why.
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

// LossReason says why a lock was lost (see [LostError]).
type LossReason uint8

const (
	// ReasonGone: a renewal or [Lock.Refresh] found the lock key gone
	// (expired on a server that was paused or unreachable, deleted,
	// flushed, or lost in a failover).
	ReasonGone LossReason = iota + 1
	// ReasonTaken: the lock key holds another acquisition's value: the
	// lock expired and someone else took it (TakenBy says who, when known).
	ReasonTaken
	// ReasonDeadline: no renewal succeeded before the local deadline
	// ([Lock.Deadline]); LastErr is the last renewal error, if any.
	ReasonDeadline
	// ReasonLeaseEnded: a fixed lease ([WithFixedLease]) ran out.
	ReasonLeaseEnded
)

// String is a short, stable label (for logs and metrics).
func (r LossReason) String() string {
	switch r {
	case ReasonGone:
		return "gone"
	case ReasonTaken:
		return "taken"
	case ReasonDeadline:
		return "deadline"
	case ReasonLeaseEnded:
		return "lease_ended"
	}
	return "unknown"
}

// LostError is the cause of a lost lock's context ([Lock.Err],
// context.Cause of [Lock.Context]), the Err of its [LossEvent], and part
// of what [Lock.Release] and [Client.Do] return after the loss. It wraps
// [ErrLockLost].
type LostError struct {
	Name   string
	Token  int64
	Reason LossReason
	// TakenBy and TakenToken name the acquisition that holds the lock now,
	// when a renewal, a Refresh or this client's own new acquisition saw it.
	TakenBy    string
	TakenToken int64
	// LastErr is the last renewal error, when renewals failed until the
	// deadline (ReasonDeadline).
	LastErr error
}

func (e *LostError) Error() string {
	return fmt.Sprintf("fence: lock lost: %q token %d: %s", e.Name, e.Token, e.why())
}

// why is the reason alone, for messages that name the lock already.
func (e *LostError) why() string {
	var why string
	switch e.Reason {
	case ReasonGone:
		why = "the key is gone (expired, deleted, flushed or lost in a failover)"
	case ReasonTaken:
		why = "another holder has it"
		if e.TakenBy != "" {
			why = fmt.Sprintf("holder %q has it with token %d", e.TakenBy, e.TakenToken)
		}
	case ReasonDeadline:
		why = "no renewal succeeded before the local deadline"
		if e.LastErr != nil {
			why += "; last renewal error: " + e.LastErr.Error()
		}
	case ReasonLeaseEnded:
		why = "its fixed lease ran out"
	default:
		why = "unknown reason"
	}
	return why
}

// Unwrap makes errors.Is(err, ErrLockLost) true. The last renewal error is
// not unwrapped: a loss is not a timeout of the caller's context.
func (e *LostError) Unwrap() error { return ErrLockLost }

// endedError is the error of a call on a lock that is no longer held: it
// matches [ErrNotHeld] and the cause (errors.Is, errors.As: a
// [*LostError], [ErrMaxHold], [ErrReleased], [ErrClosed]), and its message
// names the lock and the cause once, with one "fence:" prefix.
type endedError struct {
	msg   string
	cause error
}

func (e *endedError) Error() string   { return e.msg }
func (e *endedError) Unwrap() []error { return []error{ErrNotHeld, e.cause} }

// ended is ErrNotHeld for l with cause; when says when it was found.
func ended(l *Lock, when string, cause error) error {
	text := strings.TrimPrefix(cause.Error(), "fence: ")
	var le *LostError
	if errors.As(cause, &le) {
		text = "lock lost: " + le.why() // the name and token are given already
	}
	return &endedError{msg: fmt.Sprintf("%v: %q token %d %s: %s", ErrNotHeld, l.name, l.token, when, text), cause: cause}
}

// cutOffErr is the error of a campaign whose calls failed for a whole
// liveness period (see waiter.answered): it matches [ErrNotAcquired] and
// the last error.
func cutOffErr(name string, liveness time.Duration, last error) error {
	return fmt.Errorf("%w: campaign %q: Redis has not answered for longer than the candidate's liveness (%v), so its place in the "+
		"queue is gone; campaign again once Redis answers; last error: %w", ErrNotAcquired, name, liveness, last)
}
