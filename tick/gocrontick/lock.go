package gocrontick

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/tick"
	"github.com/go-co-op/gocron/v2"
)

// Lock implements gocron.Locker: it runs the tick gocron fired key for,
// and returns once the runner hands it to the task, or with a
// [*NotRunError] when the tick needs no run here. ctx (gocron's job
// context) bounds the tick's run.
func (l *Locker[R, Tx]) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	v, ok := l.jobs.Load(key)
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownJob, key)
	}
	j := v.(*job[R, Tx])
	<-j.ready
	// gocron schedules a job's next run once Lock returns: until then the
	// job's first scheduled run is the one it fired for.
	at, err := j.gjob.NextRun()
	if err != nil {
		return nil, fmt.Errorf("gocrontick: job %q: the instant gocron fired for: %w", key, err)
	}
	h := &held[R]{result: make(chan error, 1), done: make(chan error, 1)}
	got := make(chan struct{})
	go func() {
		out, err := l.runner.Run(ctx, key, j.def.sched, at, func(ctx context.Context, t *tick.Tick[R]) error {
			if !t.At.Equal(at.UTC()) {
				return j.fn(ctx, t) // an earlier tick left in flight: finished here, first
			}
			h.t, h.ctx = t, ctx
			close(got)
			return <-h.result
		}, l.opts...)
		if err == nil && out.Result != tick.Ran {
			err = &NotRunError{Job: key, Outcome: out}
		}
		h.done <- err
	}()
	select {
	case <-got:
		j.mu.Lock()
		j.cur = h
		j.mu.Unlock()
		return &lock[R, Tx]{j: j, h: h}, nil
	case err := <-h.done:
		if err == nil {
			err = errors.New("gocrontick: the runner returned without running the tick") // not reached: Ran runs fn
		}
		return nil, err
	}
}

// errTaskNotRun is the result of a tick whose task gocron did not run (a
// BeforeJobRunsSkipIfBeforeFuncErrors listener failed): the tick stays
// open for the next holder.
var errTaskNotRun = errors.New("gocrontick: gocron did not run the task")

// lock is a tick handed to the task, as gocron holds it.
type lock[R tick.Run[Tx], Tx any] struct {
	j *job[R, Tx]
	h *held[R]
}

// Unlock implements gocron.Lock: it ends the tick with the task's result
// (the runner finishes the tick's run when the task returned nil) and
// releases the job's lock; it returns the runner's error. ctx bounds the
// wait for the runner.
func (k *lock[R, Tx]) Unlock(ctx context.Context) error {
	k.j.mu.Lock()
	if k.j.cur == k.h {
		k.j.cur = nil
	}
	k.j.mu.Unlock()
	if !k.h.ran {
		k.h.err = errTaskNotRun
	}
	k.h.result <- k.h.err
	select {
	case err := <-k.h.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// task is the gocron task of j: the job's function, for the tick its
// Lock holds.
func (l *Locker[R, Tx]) task(j *job[R, Tx]) error {
	j.mu.Lock()
	h := j.cur
	j.mu.Unlock()
	if h == nil {
		return fmt.Errorf("gocrontick: job %q ran without its tick: run it only through its Locker (not with gocron.WithDisabledDistributedJobLocker or RunNow)", j.name)
	}
	h.ran = true
	h.err = j.fn(h.ctx, h.t)
	return h.err
}
