package tick

import (
	"context"
	"time"
)

// RunObserver is told the outcome of every [Runner.Run] call that got past
// input validation: once per tick the call handled (twice when it first
// finished a tick left in flight, see [Outcome.Resumed]).
//
// Observers are called synchronously by the goroutine that called Run,
// after the outcome is known: they must be fast. The ctx they get carries
// the values of the Run call, never its cancellation.
type RunObserver interface {
	OnTickRun(ctx context.Context, e RunEvent)
}

// MissObserver is told of ticks of a job that no instance ran: found by
// the call that starts a later tick (the ticks between the job's newest
// tick and it never started), once, by that call alone.
type MissObserver interface {
	OnTickMissed(ctx context.Context, e MissedEvent)
}

// RunEvent is the outcome of one tick handled by a Run call.
type RunEvent struct {
	Job  string
	Tick time.Time
	// Result is what happened; Err is set when the call failed (Result is
	// then 0): the job's error (a [*JobError]), the store's, or the lock's.
	Result Result
	Err    error
	// Token is the lock's token when the call held it (0 otherwise);
	// DoneBy is Outcome.Token for AlreadyDone.
	Token  int64
	DoneBy int64
	// Resumed says the job was resumed at the cursor another holder left.
	Resumed bool
	// Waited is the time spent waiting for the lock; Duration the whole
	// call up to this tick's outcome.
	Waited   time.Duration
	Duration time.Duration
}

// MissedEvent reports Count ticks of Job, from First to Last, that no
// instance ran: found when the tick Found started.
type MissedEvent struct {
	Job         string
	First, Last time.Time
	Count       int64
	Found       time.Time
}

func (r *Runner[R, Tx]) reportRun(ctx context.Context, obs []any, e RunEvent) {
	if len(obs) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	for _, o := range obs {
		if ro, ok := o.(RunObserver); ok {
			ro.OnTickRun(ctx, e)
		}
	}
}

func (r *Runner[R, Tx]) reportMissed(ctx context.Context, obs []any, e MissedEvent) {
	ctx = context.WithoutCancel(ctx)
	for _, o := range obs {
		if mo, ok := o.(MissObserver); ok {
			mo.OnTickMissed(ctx, e)
		}
	}
}
