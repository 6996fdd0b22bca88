package tick

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrInvalidInput is matched by the error of [New] and [Runner.Run]
	// for bad input (an empty job name, a nil schedule or function, a zero
	// tick, a tick in the future, an instant that is not near a tick of the
	// schedule): nothing was taken and nothing was written. The message
	// names what was given and what to pass instead.
	ErrInvalidInput = errors.New("tick: invalid input")

	// ErrInvalidOption is matched by the error of [New] and [Runner.Run]
	// for a bad option (a tolerance not below half the gap between ticks,
	// a negative wait, an observer that observes nothing): nothing was
	// taken.
	ErrInvalidOption = errors.New("tick: invalid option")

	// ErrInvalidSchedule is matched by the error of [Runner.Run] when the
	// schedule misbehaves (a Next that does not move forward) or has no
	// tick near the instant given: nothing was taken.
	ErrInvalidSchedule = errors.New("tick: invalid schedule")

	// ErrLedger is matched by the error of [Runner.Run] when the job's
	// ledger run (run key [LedgerKey]) holds a cursor this version cannot
	// read: written by hand, or by a newer version of this package.
	// Nothing of the tick ran.
	ErrLedger = errors.New("tick: unreadable ledger")
)

// JobError is the error of [Runner.Run] when the job's function failed (or
// its lock was lost while it ran) for a tick: the tick is not finished; its
// run keeps the cursor of its last committed step, where the next holder
// resumes (an instance still waiting for the tick, or the runner of the
// next tick). errors.Is matches Err.
type JobError struct {
	Job  string
	Tick time.Time
	Err  error
}

func (e *JobError) Error() string {
	return fmt.Sprintf("tick: job %q, tick %s: %v (the tick stays open: the next holder resumes it at its cursor)", e.Job, Key(e.Tick), e.Err)
}

// Unwrap returns Err.
func (e *JobError) Unwrap() error { return e.Err }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidInput}, args...)...)
}

func invalidOption(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}
