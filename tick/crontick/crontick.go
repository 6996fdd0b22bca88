package crontick

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/fencelock/fencelock/tick"
	"github.com/robfig/cron/v3"
)

// ErrInvalidInput is matched by Add's error for bad input: nothing was
// scheduled.
var ErrInvalidInput = errors.New("crontick: invalid input")

// Option configures a job added with [Add].
type Option interface {
	apply(*config) error
}

// optionFunc is an Option as a function.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	ctx      context.Context
	report   func(job string, out tick.Outcome, err error)
	tickOpts []tick.Option
}

// WithContext is the context of the job's runs (default
// context.Background()): cancel it to end the runs in flight, as
// cron.Stop does not.
func WithContext(ctx context.Context) Option {
	return optionFunc(func(c *config) error {
		if ctx == nil {
			return fmt.Errorf("%w: WithContext(nil): pass a context, e.g. one cancelled at shutdown", ErrInvalidInput)
		}
		c.ctx = ctx
		return nil
	})
}

// WithReport calls f with the outcome (or the error) of each tick the job
// handles, from the job's goroutine.
func WithReport(f func(job string, out tick.Outcome, err error)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithReport(nil): pass a function", ErrInvalidInput)
		}
		c.report = f
		return nil
	})
}

// WithTickOptions passes opts to every tick.Runner.Run call of the job.
func WithTickOptions(opts ...tick.Option) Option {
	return optionFunc(func(c *config) error {
		c.tickOpts = append(c.tickOpts, opts...)
		return nil
	})
}

// Add schedules the job name on c at the ticks of s; each tick runs fn
// through runner (see package tick): once across every instance that adds
// the same job with the same schedule. It returns the entry's id.
func Add[R tick.Run[Tx], Tx any](c *cron.Cron, runner *tick.Runner[R, Tx], name string, s cron.Schedule, fn tick.Func[R], opts ...Option) (cron.EntryID, error) {
	switch {
	case c == nil:
		return 0, fmt.Errorf("%w: nil *cron.Cron", ErrInvalidInput)
	case runner == nil:
		return 0, fmt.Errorf("%w: job %q: nil *tick.Runner: make one with tick.New", ErrInvalidInput, name)
	case name == "":
		return 0, fmt.Errorf("%w: empty job name: pass the job's name, the same on every instance", ErrInvalidInput)
	case s == nil:
		return 0, fmt.Errorf("%w: job %q: nil schedule: parse a spec with cron.ParseStandard, or pass tick.Every(period)", ErrInvalidInput, name)
	case fn == nil:
		return 0, fmt.Errorf("%w: job %q: nil func", ErrInvalidInput, name)
	}
	if d, ok := s.(cron.ConstantDelaySchedule); ok {
		return 0, fmt.Errorf("%w: job %q: @every %v counts from each instance's start, so instances do not agree on its ticks: pass tick.Every(%v), whose ticks are multiples of the period since the Unix epoch", ErrInvalidInput, name, d.Delay, d.Delay)
	}
	cfg := config{ctx: context.Background()}
	for _, o := range opts {
		if o == nil {
			return 0, fmt.Errorf("%w: job %q: nil Option", ErrInvalidInput, name)
		}
		if err := o.apply(&cfg); err != nil {
			return 0, err
		}
	}
	j := &job[R, Tx]{c: c, runner: runner, name: name, s: s, fn: fn, cfg: cfg, added: make(chan struct{})}
	j.id.Store(int64(c.Schedule(s, j)))
	close(j.added)
	return cron.EntryID(j.id.Load()), nil
}

// job is the cron.Job of a tick job.
type job[R tick.Run[Tx], Tx any] struct {
	c      *cron.Cron
	runner *tick.Runner[R, Tx]
	name   string
	s      cron.Schedule
	fn     tick.Func[R]
	cfg    config
	id     atomic.Int64  // the entry's, set once Schedule returns
	added  chan struct{} // closed once id is set
}

// Run implements cron.Job: it reads the instant cron fired for from the
// entry and runs that tick.
func (j *job[R, Tx]) Run() {
	// cron records the fired-for instant as the entry's Prev in the loop
	// that started this goroutine, before it answers Entry's request.
	<-j.added
	e := j.c.Entry(cron.EntryID(j.id.Load()))
	at := e.Prev
	var out tick.Outcome
	var err error
	if at.IsZero() {
		err = fmt.Errorf("crontick: job %q: its entry (id %d) has no fired-for instant: was it removed from the Cron?", j.name, j.id.Load())
	} else {
		out, err = j.runner.Run(j.cfg.ctx, j.name, tick.Schedule(j.s), at, j.fn, j.cfg.tickOpts...)
	}
	if j.cfg.report != nil {
		j.cfg.report(j.name, out, err)
	} else if err != nil {
		slog.Default().Error("crontick: tick failed", "job", j.name, "tick", tick.Key(at), "err", err)
	}
}

var _ cron.Job = (*job[tick.Run[any], any])(nil)
