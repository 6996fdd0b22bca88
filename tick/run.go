package tick

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/fence"
)

// Run runs fn for the tick of job at at, once across every instance that
// calls it for that tick: the first call to hold the job's lock runs fn and
// finishes the tick's run; the others return [AlreadyDone] (or
// [HeldElsewhere] when the lock stays held for their whole wait). See the
// package documentation for the rules (ticks in order, a tick left in
// flight, missed ticks, long jobs).
//
// at is the tick's scheduled instant as the scheduler computed it (its
// zone does not matter: a tick is an instant, keyed in UTC), or the
// instance's firing time within the tolerance ([WithTolerance]) of it; s
// is the job's schedule, the same on every instance. fn receives the tick,
// the lock and the tick's resumable run; Run finishes the run when fn
// returns nil, and returns [Ran]. When fn fails, the error is a
// [*JobError] and the tick stays open for the next holder.
//
// ctx bounds the whole call: the wait for the lock, the store's calls and
// fn (whose ctx also ends when the lock is lost). Bad input (an empty job
// name, a nil schedule or fn, a zero tick, an instant not within the
// tolerance of a tick, a tick in the future, a bad option) is an error
// matching [ErrInvalidInput] or [ErrInvalidOption] and takes nothing.
// err == nil exactly when Outcome.Result is set.
func (r *Runner[R, Tx]) Run(ctx context.Context, job string, s Schedule, at time.Time, fn Func[R], opts ...Option) (Outcome, error) {
	c, err := r.newCall(ctx, job, s, at, fn, opts)
	if err != nil {
		return Outcome{}, err
	}
	out, err := c.run()
	c.report(RunEvent{Tick: c.tick, Result: out.Result, Err: err, Resumed: out.Resumed,
		Token: c.lock.Token(), DoneBy: doneBy(out)})
	return out, err
}

func doneBy(out Outcome) int64 {
	if out.Result == AlreadyDone {
		return out.Token
	}
	return 0
}

// newCall checks Run's input; it takes nothing.
func (r *Runner[R, Tx]) newCall(ctx context.Context, job string, s Schedule, at time.Time, fn Func[R], opts []Option) (*call[R, Tx], error) {
	switch {
	case job == "":
		return nil, invalid(`Run: empty job name: pass the job's name, the same on every instance (e.g. "stock-sync"): it names the job's lock and runs`)
	case s == nil:
		return nil, invalid("Run: job %q: nil schedule: pass tick.Every(period) or a cron schedule (robfig/cron's parser)", job)
	case fn == nil:
		return nil, invalid("Run: job %q: nil func: pass the function that does the tick's work", job)
	case at.IsZero():
		return nil, invalid("Run: job %q: zero instant: pass the scheduled instant the scheduler fired for, not time.Time{}", job)
	}
	if e, ok := s.(Every); ok && e <= 0 {
		return nil, invalid("Run: job %q: tick.Every(%v): the period must be positive", job, time.Duration(e))
	}
	cfg := r.cfg
	if err := cfg.applyAll(opts); err != nil {
		return nil, err
	}
	t, err := findTick(job, s, at, cfg)
	if err != nil {
		return nil, err
	}
	return &call[R, Tx]{r: r, ctx: ctx, job: job, s: s, tick: t, fn: fn, cfg: cfg, start: time.Now()}, nil
}

// findTick is the tick that at names: the nearest tick of s, within the
// tolerance, and not in the future of the instance's clock.
func findTick(job string, s Schedule, at time.Time, cfg config) (time.Time, error) {
	p, err := locate(s, at)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: Run: job %q: %v", ErrInvalidSchedule, job, err)
	}
	tol := cfg.tolerance
	switch {
	case tol == 0:
		tol = DefaultTolerance
		if p.gap > 0 && p.gap/4 < tol {
			tol = p.gap / 4
		}
	case p.gap > 0 && 2*tol >= p.gap:
		return time.Time{}, invalidOption("Run: job %q: WithTolerance(%v) is not less than half the gap %v between the tick %s and its neighbour: two ticks would be within the tolerance of one instant; pass a tolerance below %v", job, tol, p.gap, Key(p.at), p.gap/2)
	}
	if d := absDur(at.Sub(p.at)); d > tol {
		return time.Time{}, invalid("Run: job %q: %s is %v from the nearest tick of the schedule (%s), more than the tolerance %v: pass the scheduled instant the scheduler fired for, or a wider WithTolerance", job, at.Format(time.RFC3339Nano), d, Key(p.at), tol)
	}
	if now := cfg.now(); p.at.After(now.Add(tol)) {
		return time.Time{}, invalid("Run: job %q: tick %s is %v in the future of this instance's clock (%s), more than the tolerance %v: pass the tick that fired; if it did, this clock is behind the scheduler's", job, Key(p.at), p.at.Sub(now), now.UTC().Format(time.RFC3339Nano), tol)
	}
	return p.at, nil
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// run takes the job's lock, then does what the ledger says.
func (c *call[R, Tx]) run() (Outcome, error) {
	out := Outcome{Tick: c.tick}
	lock, err := c.acquire()
	if err != nil {
		return Outcome{}, err
	}
	if lock == nil {
		return c.held(out)
	}
	c.lock = lock
	// Released whatever happens; a release that fails leaves the lock to
	// expire with its lease, which delays the next holder and loses
	// nothing.
	defer func() { _ = lock.Release(context.WithoutCancel(c.ctx)) }()
	return c.locked(out)
}

// acquire takes the job's lock, waiting until the wait ends: nil (and no
// error) when it stayed held.
func (c *call[R, Tx]) acquire() (*fence.Lock, error) {
	var until time.Duration
	if c.cfg.waitSet {
		until = c.cfg.wait
	} else if next := c.s.Next(c.tick); !next.IsZero() {
		until = next.Sub(c.cfg.now())
	}
	var lock *fence.Lock
	var err error
	if until <= 0 {
		lock, err = c.r.locks.TryAcquire(c.ctx, c.job, c.cfg.lockOpts...)
	} else {
		wctx, cancel := context.WithTimeout(c.ctx, until)
		lock, err = c.r.locks.Acquire(wctx, c.job, c.cfg.lockOpts...)
		cancel()
	}
	c.waited = time.Since(c.start)
	switch {
	case err == nil:
		return lock, nil
	case c.ctx.Err() != nil:
		return nil, err
	case errors.Is(err, fence.ErrNotAcquired) && !errors.Is(err, fence.ErrInvalidOption) && !errors.Is(err, fence.ErrInvalidName):
		return nil, c.heldErr(err)
	}
	return nil, err
}

// heldErr tells a lock that stayed held from a wait that rode out an
// outage: the lock's state must be readable, or the wait's error stands.
func (c *call[R, Tx]) heldErr(waitErr error) error {
	ictx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
	defer cancel()
	info, err := c.r.locks.Inspect(ictx, c.job)
	if err != nil {
		return waitErr
	}
	c.heldInfo = info
	return nil
}

func (c *call[R, Tx]) held(out Outcome) (Outcome, error) {
	out.Result = HeldElsewhere
	out.Holder, out.Token = c.heldInfo.Holder, c.heldInfo.Token
	return out, nil
}
