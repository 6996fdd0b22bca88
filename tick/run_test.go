package tick_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/tick"
	"github.com/fencelock/fencelock/tick/ticktest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// minute is the schedule of most tests: its ticks are whole minutes, and
// the tests pass ticks in the past (a tick is refused only in the future).
var minute = tick.Every(time.Minute)

// past is a tick of minute an hour ago.
func past() time.Time { return tick.Prev(minute, time.Now()).Add(-time.Hour) }

func count(t *testing.T, env *ticktest.Env, job string) []ticktest.TickCount {
	t.Helper()
	c, err := ticktest.Count(testCtx(t), env.DB.Pool, job)
	require.NoError(t, err)
	return c
}

func TestOneRunPerTickAmongInstances(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	at := past()
	outs := make([]tick.Outcome, 4)
	var wg sync.WaitGroup
	for i := range outs {
		inst := env.NewInstance(t)
		job := ticktest.Job{Instance: string(rune('a' + i)), Steps: 3}
		wg.Go(func() {
			var err error
			outs[i], err = inst.Runner.Run(ctx, "sync", minute, at, job.Func(), tick.WithWait(time.Minute))
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	var ran tick.Outcome
	for _, o := range outs {
		if o.Result == tick.Ran {
			require.Zero(t, ran.Result, "two calls ran the tick: %+v", outs)
			ran = o
		}
	}
	require.Equal(t, tick.Ran, ran.Result, "no call ran the tick: %+v", outs)
	for _, o := range outs {
		assert.True(t, o.Tick.Equal(at.UTC()), "outcome's tick %s, want %s", o.Tick, at)
		if o.Result != tick.Ran {
			assert.Equal(t, tick.AlreadyDone, o.Result)
			assert.Equal(t, ran.Token, o.Token, "AlreadyDone names the token that ran the tick")
		}
	}
	c := count(t, env, "sync")
	require.Len(t, c, 1)
	assert.Equal(t, ticktest.TickCount{Tick: at.UTC(), Runs: 1, Holders: 1}, c[0])
}

// A late instance, whose ticker fired after the tick ran (an offset clock,
// a slow start), finds it done: the lock alone would let it run again.
func TestLateInstanceFindsTickDone(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	at := past()
	a, b := env.NewInstance(t), env.NewInstance(t)
	out, err := a.Runner.Run(ctx, "sync", minute, at, ticktest.Job{Instance: "a", Steps: 2}.Func())
	require.NoError(t, err)
	require.Equal(t, tick.Ran, out.Result)
	// b passes its own firing time, 700 ms late: the same tick.
	late, err := b.Runner.Run(ctx, "sync", minute, at.Add(700*time.Millisecond), ticktest.Job{Instance: "b", Steps: 2}.Func())
	require.NoError(t, err)
	assert.Equal(t, tick.AlreadyDone, late.Result)
	assert.Equal(t, out.Token, late.Token)
	assert.Equal(t, 1, count(t, env, "sync")[0].Runs)

	// The control: the same two instances with the lock alone run it twice.
	job := ticktest.Job{Instance: "x", Steps: 2}
	require.NoError(t, ticktest.LockOnly(ctx, a.Locks, env.DB.Pool, "control", at, job))
	require.NoError(t, ticktest.LockOnly(ctx, b.Locks, env.DB.Pool, "control", at, job))
	assert.Equal(t, 2, count(t, env, "control")[0].Runs, "the lock alone runs a late instance's tick again")
}

var errBoom = errors.New("boom")

// failAt fails the job once, before step n.
func failAt(n int) func(context.Context, *tick.Tick[pgfence.Run], int) error {
	var once sync.Once
	return func(_ context.Context, _ *tick.Tick[pgfence.Run], step int) (err error) {
		if step == n {
			once.Do(func() { err = errBoom })
		}
		return err
	}
}

func TestFailedTickResumedAtItsCursor(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	at := past()
	a, b := env.NewInstance(t), env.NewInstance(t)
	_, err := a.Runner.Run(ctx, "sync", minute, at, ticktest.Job{Instance: "a", Steps: 4, BeforeStep: failAt(3)}.Func())
	var je *tick.JobError
	require.ErrorAs(t, err, &je)
	require.ErrorIs(t, err, errBoom)
	assert.Equal(t, "sync", je.Job)
	assert.True(t, je.Tick.Equal(at))

	var seen *tick.Tick[pgfence.Run]
	job := ticktest.Job{Instance: "b", Steps: 4, BeforeStep: func(_ context.Context, tk *tick.Tick[pgfence.Run], _ int) error {
		if seen == nil {
			seen = tk
		}
		return nil
	}}
	out, err := b.Runner.Run(ctx, "sync", minute, at, job.Func())
	require.NoError(t, err)
	assert.Equal(t, tick.Ran, out.Result)
	assert.True(t, out.Resumed)
	require.NotNil(t, seen)
	assert.Equal(t, "2", seen.Cursor, "resumed after the last committed step")
	assert.True(t, seen.Resumed)
	c := count(t, env, "sync")
	assert.Equal(t, ticktest.TickCount{Tick: at.UTC(), Runs: 1, Holders: 2}, c[0])
}

// The next tick's runner finishes a tick left in flight before its own,
// when no instance waited for it any more.
func TestPreviousTickInFlightFinishedFirst(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	at := past()
	a, b := env.NewInstance(t), env.NewInstance(t)
	_, err := a.Runner.Run(ctx, "sync", minute, at, ticktest.Job{Instance: "a", Steps: 3, BeforeStep: failAt(2)}.Func())
	require.ErrorIs(t, err, errBoom)

	rec := &recorder{}
	next := at.Add(time.Minute)
	out, err := b.Runner.Run(ctx, "sync", minute, next, ticktest.Job{Instance: "b", Steps: 3}.Func(), tick.WithObserver(rec))
	require.NoError(t, err)
	assert.Equal(t, tick.Ran, out.Result)
	assert.Equal(t, []time.Time{at.UTC()}, out.Earlier)
	assert.Zero(t, out.Missed)
	c := count(t, env, "sync")
	require.Len(t, c, 2)
	assert.Equal(t, ticktest.TickCount{Tick: at.UTC(), Runs: 1, Holders: 2}, c[0])
	assert.Equal(t, ticktest.TickCount{Tick: next.UTC(), Runs: 1, Holders: 1}, c[1])
	ev := rec.runEvents()
	require.Len(t, ev, 2)
	assert.True(t, ev[0].Tick.Equal(at) && ev[0].Resumed && ev[0].Result == tick.Ran, "first event: %+v", ev[0])
	assert.True(t, ev[1].Tick.Equal(next) && ev[1].Result == tick.Ran, "second event: %+v", ev[1])
}

func TestMissedTicksReportedAndSuperseded(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	at := past()
	rec := &recorder{}
	a := env.NewInstance(t, tick.WithObserver(rec))
	job := ticktest.Job{Instance: "a", Steps: 1}.Func()
	_, err := a.Runner.Run(ctx, "sync", minute, at, job)
	require.NoError(t, err)
	out, err := a.Runner.Run(ctx, "sync", minute, at.Add(3*time.Minute), job)
	require.NoError(t, err)
	assert.Equal(t, int64(2), out.Missed)
	m := rec.missedEvents()
	require.Len(t, m, 1)
	assert.Equal(t, tick.MissedEvent{Job: "sync", First: at.Add(time.Minute).UTC(), Last: at.Add(2 * time.Minute).UTC(),
		Count: 2, Found: at.Add(3 * time.Minute).UTC()}, m[0])

	// A missed tick that fires late is not run after a newer one.
	assert.Empty(t, out.Earlier)
	out, err = a.Runner.Run(ctx, "sync", minute, at.Add(time.Minute), job)
	require.NoError(t, err)
	assert.Equal(t, tick.Superseded, out.Result)
	assert.True(t, out.Newest.Equal(at.Add(3*time.Minute)))
	assert.Len(t, count(t, env, "sync"), 2)
}

// The first tick started begins a job's history: the ticks before it are
// not run first, even within their wait, nor counted missed, and an older
// tick's call that comes after it is superseded.
func TestFirstTickBeginsHistory(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	at := past()
	a := env.NewInstance(t)
	wait := tick.WithWait(2 * time.Hour) // the earlier ticks' wait is not over
	job := ticktest.Job{Instance: "a", Steps: 1}.Func()
	out, err := a.Runner.Run(ctx, "sync", minute, at.Add(2*time.Minute), job, wait)
	require.NoError(t, err)
	assert.Equal(t, tick.Ran, out.Result)
	assert.Empty(t, out.Earlier, "no tick before the first is run")
	assert.Zero(t, out.Missed, "no tick before the first is missed")
	out, err = a.Runner.Run(ctx, "sync", minute, at, job, wait)
	require.NoError(t, err)
	assert.Equal(t, tick.Superseded, out.Result)
	assert.True(t, out.Newest.Equal(at.Add(2*time.Minute)))
	c := count(t, env, "sync")
	require.Len(t, c, 1)
	assert.True(t, c[0].Tick.Equal(at.Add(2*time.Minute)))
}

// Pruning finished runs does not re-open their ticks: the ledger, never
// finished, is never pruned.
func TestPruneDoesNotReopenTicks(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	at := past()
	a := env.NewInstance(t)
	job := ticktest.Job{Instance: "a", Steps: 1}.Func()
	first, err := a.Runner.Run(ctx, "sync", minute, at, job)
	require.NoError(t, err)
	second, err := a.Runner.Run(ctx, "sync", minute, at.Add(time.Minute), job)
	require.NoError(t, err)
	n, err := a.Store.Prune(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "both ticks' runs pruned")

	out, err := a.Runner.Run(ctx, "sync", minute, at, job)
	require.NoError(t, err)
	assert.Equal(t, tick.Superseded, out.Result, "an older pruned tick")
	out, err = a.Runner.Run(ctx, "sync", minute, at.Add(time.Minute), job)
	require.NoError(t, err)
	assert.Equal(t, tick.AlreadyDone, out.Result, "the newest pruned tick")
	assert.Equal(t, second.Token, out.Token)
	assert.NotEqual(t, first.Token, second.Token)
	for _, c := range count(t, env, "sync") {
		assert.Equal(t, 1, c.Runs, "tick %s", c.Tick)
	}
}

func TestHeldElsewhere(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	a := env.NewInstance(t)
	other := env.NewInstance(t)
	held, err := other.Locks.Acquire(ctx, "sync", fence.WithHolder("long-job"))
	require.NoError(t, err)
	defer held.Release(ctx)
	ran := false
	out, err := a.Runner.Run(ctx, "sync", minute, past(), func(context.Context, *tick.Tick[pgfence.Run]) error {
		ran = true
		return nil
	}, tick.WithWait(200*time.Millisecond))
	require.NoError(t, err)
	assert.False(t, ran)
	assert.Equal(t, tick.HeldElsewhere, out.Result)
	assert.Equal(t, "long-job", out.Holder)
	assert.Equal(t, held.Token(), out.Token)

	// A tick whose next one is already due makes one attempt.
	out, err = a.Runner.Run(ctx, "sync", minute, past(), func(context.Context, *tick.Tick[pgfence.Run]) error { return nil })
	require.NoError(t, err)
	assert.Equal(t, tick.HeldElsewhere, out.Result)
}

// The lock lost in the middle of a tick: the job's ctx ends, its writes are
// refused, and the next holder resumes.
func TestLockLostMidTick(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	at := past()
	a, b := env.NewInstance(t), env.NewInstance(t)
	job := ticktest.Job{Instance: "a", Steps: 3, BeforeStep: func(ctx context.Context, tk *tick.Tick[pgfence.Run], step int) error {
		if step != 2 {
			return nil
		}
		// Another holder takes the lock as if this one's lease ran out.
		info, err := a.Locks.Inspect(ctx, "sync")
		if err != nil {
			return err
		}
		if _, err := a.Locks.ForceRelease(ctx, info); err != nil {
			return err
		}
		<-ctx.Done() // the job's ctx ends with the lock
		return nil   // and tries its step anyway: refused
	}}
	_, err := a.Runner.Run(ctx, "sync", minute, at, job.Func(), tick.WithLockOptions(fence.WithLease(time.Second)))
	require.Error(t, err)
	require.ErrorAs(t, err, new(*tick.JobError))
	out, err := b.Runner.Run(ctx, "sync", minute, at, ticktest.Job{Instance: "b", Steps: 3}.Func())
	require.NoError(t, err)
	assert.Equal(t, tick.Ran, out.Result)
	assert.True(t, out.Resumed)
	c := count(t, env, "sync")
	assert.Equal(t, ticktest.TickCount{Tick: at.UTC(), Runs: 1, Holders: 2}, c[0])
}

// A later tick's caller that gets the lock before the callers of earlier
// ticks (a queue whose earlier waiters were slow, a clock ahead) runs the
// earlier ticks whose wait is not over first, in order: they are not
// missed, and their own callers then find them done.
func TestTicksStillDueRunFirst(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	at := past()
	a, b := env.NewInstance(t), env.NewInstance(t)
	rec := &recorder{}
	wait := tick.WithWait(2 * time.Hour) // the ticks of the last hour are still due
	job := ticktest.Job{Instance: "a", Steps: 2}.Func()
	_, err := a.Runner.Run(ctx, "sync", minute, at, job, wait)
	require.NoError(t, err)
	out, err := a.Runner.Run(ctx, "sync", minute, at.Add(3*time.Minute), job, wait, tick.WithObserver(rec))
	require.NoError(t, err)
	assert.Equal(t, tick.Ran, out.Result)
	assert.Equal(t, []time.Time{at.Add(time.Minute).UTC(), at.Add(2 * time.Minute).UTC()}, out.Earlier)
	assert.Zero(t, out.Missed)
	assert.Empty(t, rec.missedEvents())
	assert.Len(t, rec.runEvents(), 3, "one event per tick run")
	late, err := b.Runner.Run(ctx, "sync", minute, at.Add(time.Minute), ticktest.Job{Instance: "b", Steps: 2}.Func(), wait)
	require.NoError(t, err)
	assert.Equal(t, tick.AlreadyDone, late.Result, "the earlier tick's own caller finds it done")
	assert.Equal(t, out.Token, late.Token)
	c := count(t, env, "sync")
	require.Len(t, c, 4)
	for _, tc := range c {
		assert.Equal(t, 1, tc.Runs, "tick %s", tc.Tick)
	}

	// Ticks whose wait is over are missed, the ones still due run: by
	// this instance's clock, an hour after at, the wait of the ticks up to
	// 6 minutes after at is over.
	clock := tick.WithClock(func() time.Time { return at.Add(time.Hour) })
	out, err = a.Runner.Run(ctx, "sync", minute, at.Add(10*time.Minute), job, tick.WithWait(time.Hour-6*time.Minute-30*time.Second), clock)
	require.NoError(t, err)
	assert.Equal(t, int64(3), out.Missed, "ticks 4, 5 and 6 minutes after: their wait ended")
	assert.Equal(t, []time.Time{at.Add(7 * time.Minute).UTC(), at.Add(8 * time.Minute).UTC(), at.Add(9 * time.Minute).UTC()}, out.Earlier)
}
