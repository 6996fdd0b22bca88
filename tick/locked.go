package tick

import (
	"context"
	"slices"
	"time"
)

// The rules a call follows once it holds the job's lock, all read from and
// written to the job's ledger (ledger.go) and the ticks' runs, in fenced
// steps under the lock's token:
//
//   - a tick older than the newest started is never started: it is
//     AlreadyDone when its run is finished, else Superseded (a tick that
//     was missed, or finished and pruned: the ledger is never pruned, so
//     Prune cannot re-open a tick);
//   - the newest tick, finished: AlreadyDone;
//   - the newest tick, in flight (its runner died or failed): resumed at
//     its run's cursor, by a call for it or for any later tick, before
//     that later tick starts;
//   - a later tick: the ticks between the newest and it are missed
//     (recorded and reported), it is recorded as started, fn runs, its run
//     is finished, the ledger records who finished it.

// locked does the call's work under the job's lock.
func (c *call[R, Tx]) locked(out Outcome) (Outcome, error) {
	led := c.r.store.Run(c.lock, LedgerKey)
	// A first read settles the common case, a tick some instance already
	// ran, without writing: what it reads is final (a finished run stays
	// finished, the newest tick only grows).
	l, err := c.readLedger(led)
	if err != nil {
		return Outcome{}, err
	}
	if o, ok, err := c.settled(l, out); ok || err != nil {
		return o, err
	}
	// Claim the fence before reading what to resume: from here on a
	// previous holder that is paused cannot move the ledger or a run.
	if err := c.r.store.Advance(c.ctx, c.lock); err != nil {
		return Outcome{}, err
	}
	if l, err = c.readLedger(led); err != nil {
		return Outcome{}, err
	}
	if o, ok, err := c.settled(l, out); ok || err != nil {
		return o, err
	}
	if !l.Newest.IsZero() && !l.Finished {
		resumed, err := c.finishNewest(led, &l)
		if err != nil {
			return Outcome{}, err
		}
		if l.Newest.Equal(c.tick) {
			if !resumed { // it had finished; its finisher died before the ledger said so
				out.Result, out.Token = AlreadyDone, l.Token
				return out, nil
			}
			out.Result, out.Token, out.Resumed = Ran, c.lock.Token(), true
			return out, nil
		}
		if resumed {
			out.Earlier = append(out.Earlier, l.Newest)
		}
	}
	return c.startTick(led, l, out)
}

func (c *call[R, Tx]) readLedger(led R) (ledger, error) {
	cur, _, err := led.Resume(c.ctx)
	if err != nil {
		return ledger{}, err
	}
	return decodeLedger(c.job, cur)
}

// settled answers a call whose tick needs no writing: one older than the
// newest started, or the newest once finished.
func (c *call[R, Tx]) settled(l ledger, out Outcome) (Outcome, bool, error) {
	switch {
	case l.Newest.IsZero() || c.tick.After(l.Newest):
		return out, false, nil
	case c.tick.Equal(l.Newest):
		if !l.Finished {
			return out, false, nil
		}
		out.Result, out.Token = AlreadyDone, l.Token
		return out, true, nil
	}
	_, finished, err := c.r.store.Run(c.lock, Key(c.tick)).Resume(c.ctx)
	if err != nil {
		return Outcome{}, true, err
	}
	if finished {
		out.Result, out.Token = AlreadyDone, l.doneBy(c.tick)
	} else {
		out.Result, out.Newest = Superseded, l.Newest
	}
	return out, true, nil
}

// finishNewest resumes the ledger's newest tick, in flight, at its
// cursor and finishes it; resumed is false when its run had finished
// already (its finisher died before recording it). It records the finish
// in the ledger (l is updated).
func (c *call[R, Tx]) finishNewest(led R, l *ledger) (resumed bool, err error) {
	t := l.Newest
	run := c.r.store.Run(c.lock, Key(t))
	cursor, finished, err := run.Resume(c.ctx)
	if err != nil {
		return false, err
	}
	token := l.Token // unknown finisher: the starter's is the best guess
	if !finished {
		if err := c.runJob(t, run, cursor, true); err != nil {
			return false, err
		}
		token = c.lock.Token()
		if !t.Equal(c.tick) {
			c.report(RunEvent{Tick: t, Result: Ran, Resumed: true, Token: token})
		}
	}
	*l = l.finished(t, token)
	return !finished, led.Step(c.ctx, l.encode(), nil)
}

// startTick runs the call's tick, newer than the ledger's newest
// (finished): first the ticks between them that are still due, in order
// (the rest are missed), then its own.
func (c *call[R, Tx]) startTick(led R, l ledger, out Outcome) (Outcome, error) {
	var due []time.Time
	if !l.Newest.IsZero() {
		var m *MissedTicks
		due, m = c.between(l.Newest)
		if m != nil {
			out.Missed = m.Count
			l.Missed = keepLast(append(l.Missed[:len(l.Missed):len(l.Missed)], *m))
			if len(c.cfg.observers) > 0 {
				c.r.reportMissed(c.ctx, c.cfg.observers, MissedEvent{Job: c.job, First: m.First, Last: m.Last, Count: m.Count, Found: c.tick})
			}
		}
	}
	token := c.lock.Token()
	for _, t := range append(due, c.tick) {
		var err error
		if l, err = c.runNew(led, l, t); err != nil {
			return Outcome{}, err
		}
		if !t.Equal(c.tick) {
			out.Earlier = append(out.Earlier, t)
			c.report(RunEvent{Tick: t, Result: Ran, Token: token})
		}
	}
	out.Result, out.Token = Ran, token
	return out, nil
}

// runNew records tick t as started, runs the job, finishes t's run, and
// records who finished it.
func (c *call[R, Tx]) runNew(led R, l ledger, t time.Time) (ledger, error) {
	token := c.lock.Token()
	l = l.started(t, token)
	if err := led.Step(c.ctx, l.encode(), nil); err != nil {
		return l, err
	}
	if err := c.runJob(t, c.r.store.Run(c.lock, Key(t)), "", false); err != nil {
		return l, err
	}
	l = l.finished(t, token)
	// Should this step fail, t's run is finished all the same: a later
	// call sees it done (and records it).
	return l, led.Step(c.ctx, l.encode(), nil)
}

// maxDue bounds the ticks still due that one call runs before its own;
// older ones count as missed.
const maxDue = 1000

// between splits the ticks strictly between newest and the call's tick
// into the missed (their wait is over by this instance's clock: no
// caller of theirs waits any more) and those still due, oldest first.
// A tick's wait ends WithWait after it, or when the tick after it is due.
func (c *call[R, Tx]) between(newest time.Time) (due []time.Time, missed *MissedTicks) {
	now := c.cfg.now()
	n, first, last, _ := missedBetween(c.s, newest, c.tick)
	if n == 0 {
		return nil, nil
	}
	// Ticks are due from the newest back while their wait is not over.
	for t := last; !t.Before(first) && len(due) < maxDue; t = Prev(c.s, t.Add(-time.Nanosecond)) {
		if !now.Before(c.waitEnd(t)) {
			break
		}
		due = append(due, t)
	}
	slices.Reverse(due)
	if int64(len(due)) == n {
		return due, nil
	}
	m := &MissedTicks{First: first, Count: n - int64(len(due)), Found: c.tick, Last: last}
	if len(due) > 0 {
		m.Last = Prev(c.s, due[0].Add(-time.Nanosecond))
	}
	return due, m
}

// waitEnd is when the callers of tick t stop waiting for it.
func (c *call[R, Tx]) waitEnd(t time.Time) time.Time {
	if c.cfg.waitSet {
		return t.Add(c.cfg.wait)
	}
	if next := c.s.Next(t); !next.IsZero() {
		return next
	}
	return t
}

// runJob runs fn for tick t, then finishes t's run.
func (c *call[R, Tx]) runJob(t time.Time, run R, cursor string, resumed bool) error {
	ctx, cancel := context.WithCancelCause(c.lock.Context())
	stop := context.AfterFunc(c.ctx, func() { cancel(context.Cause(c.ctx)) })
	defer func() {
		stop()
		cancel(nil)
	}()
	tk := &Tick[R]{Job: c.job, At: t, Key: Key(t), Lock: c.lock, Run: run, Cursor: cursor, Resumed: resumed}
	if err := c.fn(ctx, tk); err != nil {
		return &JobError{Job: c.job, Tick: t, Err: err}
	}
	if err := run.Finish(c.ctx); err != nil {
		return &JobError{Job: c.job, Tick: t, Err: err}
	}
	return nil
}

// report tells the call's observers of one tick it handled.
func (c *call[R, Tx]) report(e RunEvent) {
	if len(c.cfg.observers) == 0 {
		return
	}
	e.Job = c.job
	e.Duration = time.Since(c.start)
	e.Waited = c.waited
	c.r.reportRun(c.ctx, c.cfg.observers, e)
}
