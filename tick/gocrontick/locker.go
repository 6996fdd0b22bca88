package gocrontick

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fencelock/fencelock/tick"
	"github.com/go-co-op/gocron/v2"
)

// Locker is a gocron.Locker whose locks are ticks of package tick: add jobs
// with [Locker.NewJob]. It is safe for concurrent use.
type Locker[R tick.Run[Tx], Tx any] struct {
	runner *tick.Runner[R, Tx]
	opts   []tick.Option
	jobs   sync.Map // name → *job[R, Tx]
}

var _ gocron.Locker = (*Locker[tick.Run[any], any])(nil)

// NewLocker returns a Locker that runs its jobs' ticks through runner,
// with opts given to every tick.Runner.Run call.
func NewLocker[R tick.Run[Tx], Tx any](runner *tick.Runner[R, Tx], opts ...tick.Option) (*Locker[R, Tx], error) {
	if runner == nil {
		return nil, fmt.Errorf("%w: NewLocker: nil *tick.Runner: make one with tick.New", ErrInvalidInput)
	}
	return &Locker[R, Tx]{runner: runner, opts: opts}, nil
}

// job is a job of the Locker.
type job[R tick.Run[Tx], Tx any] struct {
	name  string
	def   Definition
	fn    tick.Func[R]
	gjob  gocron.Job
	ready chan struct{} // closed once gjob is set
	// cur is the tick handed to the task, between Lock and Unlock. gocron
	// holds the lock around the task, and the next run's Lock waits for
	// the job's fence lock, so one is current at a time.
	mu  sync.Mutex
	cur *held[R]
}

// held is a tick that Lock got from the runner, for the task.
type held[R any] struct {
	t      *tick.Tick[R]
	ctx    context.Context
	ran    bool
	err    error      // the task's
	result chan error // Unlock → the runner's fn
	done   chan error // the runner's Run → Unlock
}

// NewJob adds the job name to s at the ticks of def, with this Locker as
// its distributed locker: each tick runs fn once across every instance
// that adds the same job. opts are gocron's (gocron.WithName, the task and
// the locker are set here).
func (l *Locker[R, Tx]) NewJob(s gocron.Scheduler, def Definition, name string, fn tick.Func[R], opts ...gocron.JobOption) (gocron.Job, error) {
	switch {
	case s == nil:
		return nil, fmt.Errorf("%w: NewJob(%q): nil gocron.Scheduler", ErrInvalidInput, name)
	case name == "":
		return nil, fmt.Errorf("%w: NewJob: empty job name: pass the job's name, the same on every instance", ErrInvalidInput)
	case def.def == nil:
		return nil, fmt.Errorf("%w: NewJob(%q): empty Definition: make one with gocrontick.Cron or gocrontick.Every", ErrInvalidInput, name)
	case fn == nil:
		return nil, fmt.Errorf("%w: NewJob(%q): nil func", ErrInvalidInput, name)
	}
	j := &job[R, Tx]{name: name, def: def, fn: fn, ready: make(chan struct{})}
	if _, dup := l.jobs.LoadOrStore(name, j); dup {
		return nil, fmt.Errorf("%w: NewJob(%q): this Locker has a job of that name: names identify jobs across instances", ErrInvalidInput, name)
	}
	all := append([]gocron.JobOption{gocron.WithName(name), gocron.WithDistributedJobLocker(l)}, opts...)
	if def.start != nil {
		all = append(all, def.start(time.Now()))
	}
	gj, err := s.NewJob(def.def, gocron.NewTask(func() error { return l.task(j) }), all...)
	if err != nil {
		l.jobs.Delete(name)
		return nil, fmt.Errorf("gocrontick: NewJob(%q): %w", name, err)
	}
	j.gjob = gj
	close(j.ready)
	return gj, nil
}
