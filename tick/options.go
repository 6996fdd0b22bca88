package tick

import (
	"time"

	"github.com/fencelock/fencelock/fence"
)

// DefaultTolerance is how far the instant given to [Runner.Run] may be from
// the tick it names when [WithTolerance] is not given, or a quarter of the
// gap between the tick and its nearer neighbour when that is shorter.
const DefaultTolerance = time.Second

// Option configures a [Runner] (given to [New]: the default of every call)
// or one call of [Runner.Run] (overriding the Runner's for that call). A
// bad value is an error matching [ErrInvalidOption] from the call that got
// it.
type Option interface {
	apply(*config) error
}

// optionFunc is an Option as a function.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	tolerance time.Duration // 0: the default, which depends on the schedule
	wait      time.Duration // 0: until the next tick is due
	waitSet   bool
	lockOpts  []fence.LockOption
	observers []any
	now       func() time.Time
}

func defaultConfig() config { return config{now: time.Now} }

func (c *config) applyAll(opts []Option) error {
	for _, o := range opts {
		if o == nil {
			return invalidOption("nil Option")
		}
		if err := o.apply(c); err != nil {
			return err
		}
	}
	return nil
}

// WithTolerance sets how far the instant given to Run may lie from the
// tick it names, either way: instances that pass their own firing time
// (their ticker's, their clock's) agree on the tick while their clocks and
// delays differ by less than d. d must be positive and less than half the
// gap between two ticks of the job's schedule, so that every instant is
// within d of one tick at most (Run checks it against the gaps around the
// tick). Default: [DefaultTolerance], or a quarter of the shorter gap
// around the tick when that is less.
func WithTolerance(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return invalidOption("WithTolerance(%v): must be positive: pass how far an instance's firing time may be from the tick, e.g. WithTolerance(2*time.Second)", d)
		}
		c.tolerance = d
		return nil
	})
}

// WithWait bounds how long Run waits for the job's lock while another
// holder has it, from the call: past d the call returns [HeldElsewhere].
// Default: until the next tick of the schedule is due (a call made after
// that makes one attempt), so that the instances waiting for a tick are
// still there to meet it (see it done, or resume it when its runner dies)
// and never queue behind the next tick's. d must be positive.
func WithWait(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return invalidOption("WithWait(%v): must be positive: pass how long a call may wait for the job's lock, e.g. WithWait(30*time.Second)", d)
		}
		c.wait, c.waitSet = d, true
		return nil
	})
}

// WithLockOptions passes opts to the acquisition of the job's lock, such
// as fence.WithLease: a tick whose runner died is resumed by another
// instance once the lease runs out, so a short lease resumes it sooner.
// The wait is set by [WithWait]; do not pass fence.WithWaitLimit.
func WithLockOptions(opts ...fence.LockOption) Option {
	return optionFunc(func(c *config) error {
		for _, o := range opts {
			if o == nil {
				return invalidOption("WithLockOptions: nil fence.LockOption")
			}
		}
		c.lockOpts = append(c.lockOpts[:len(c.lockOpts):len(c.lockOpts)], opts...)
		return nil
	})
}

// WithObserver adds o to the observers told of every call's outcome
// ([RunObserver]) and of missed ticks ([MissObserver]); o must implement
// at least one of them. Each call of the option adds one.
func WithObserver(o any) Option {
	return optionFunc(func(c *config) error {
		_, run := o.(RunObserver)
		_, miss := o.(MissObserver)
		if !run && !miss {
			return invalidOption("WithObserver(%T): implements neither RunObserver nor MissObserver", o)
		}
		c.observers = append(c.observers[:len(c.observers):len(c.observers)], o)
		return nil
	})
}

// WithClock makes Run read the time from now instead of time.Now: to run
// an instance on a clock of its own (a test of clock offsets) or one the
// application keeps. The clock is read for the check that a tick is not in
// the future and for the default wait; the tick itself is the instant
// given to Run. now must not be nil.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) error {
		if now == nil {
			return invalidOption("WithClock(nil): pass a function that returns the time, e.g. time.Now")
		}
		c.now = now
		return nil
	})
}
