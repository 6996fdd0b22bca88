package gocrontick

import (
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/tick"
)

var (
	// ErrInvalidInput is matched by the errors of NewLocker, NewJob, Cron
	// and Every for bad input: nothing was scheduled.
	ErrInvalidInput = errors.New("gocrontick: invalid input")

	// ErrUnknownJob is Lock's error for a job name that was not added with
	// Locker.NewJob: its schedule is unknown, so its tick is too.
	ErrUnknownJob = errors.New("gocrontick: job not added with Locker.NewJob")

	// ErrNotLeader is Elector.IsLeader's error while this instance does
	// not hold the term: gocron skips the run.
	ErrNotLeader = errors.New("gocrontick: not the leader")
)

// NotRunError is Lock's error when the tick needs no run here: Outcome
// says why (already done, held elsewhere, superseded). gocron skips the
// task and passes the error to AfterLockError listeners.
type NotRunError struct {
	Job     string
	Outcome tick.Outcome
}

func (e *NotRunError) Error() string {
	return fmt.Sprintf("gocrontick: job %q, tick %s: %s", e.Job, tick.Key(e.Outcome.Tick), e.Outcome.Result)
}
