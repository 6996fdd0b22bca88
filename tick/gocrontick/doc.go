// Package gocrontick runs gocron v2 jobs as ticks of package tick: every
// instance runs the same jobs on its own gocron.Scheduler, and each tick
// runs once across them, fenced to the database. It is a module of its own
// (github.com/fencelock/fencelock/tick/gocrontick), so that the library's
// go.mod carries no scheduler.
//
// A [Locker] is a gocron.Locker. Its [Locker.NewJob] adds a job to a
// scheduler with the Locker as the job's distributed locker:
//
//	l, err := gocrontick.NewLocker(runner) // a *tick.Runner
//	def, err := gocrontick.Cron("*/5 * * * *", false)
//	j, err := l.NewJob(s, def, "stock-sync", func(ctx context.Context, t *tick.Tick[pgfence.Run]) error {
//		... // t.At is the tick, t.Run its resumable run, t.Lock the job's lock
//	})
//
// gocron gives a Locker only the job's name. The Locker knows the job's
// definition ([Definition], made by [Cron] or [Every], which give gocron
// and package tick the same schedule) and reads the instant gocron fired
// for from the job itself: at the time gocron calls Lock, the job's first
// scheduled run (Job.NextRun) is that instant, since gocron schedules the
// next run only once Lock has returned. It never rounds the clock.
//
// Lock runs tick.Runner.Run for that tick, and returns a lock once the
// runner hands the tick to the job; gocron then runs the task, which
// receives the tick (its lock, a guard.Lease, and its resumable run), and
// Unlock finishes the tick with the task's result. When the tick needs no
// run here (already done, held elsewhere, superseded), Lock returns an
// error that says so ([*NotRunError]): gocron skips the task and reports
// it to AfterLockError listeners. The ticks the runner runs before the one
// gocron fired (tick.Outcome.Earlier: one left in flight, ticks still due)
// are run by Lock itself, with the same function.
//
// While Lock waits for the job's lock (tick.WithWait), gocron fires
// nothing else for that job, and once Lock returns it schedules the next
// instant still ahead, skipping those that passed: the runner of that
// next fire runs the skipped ticks first if they are still due. Give the
// runner a wait longer than the longest a holder may take to hand the
// lock over (a lost holder's lease, a waiter's heartbeat, a loaded
// machine), or a tick skipped by every instance is missed.
//
// [Every] makes a duration job that starts on a tick of tick.Every, so
// that every instance's gocron fires at the same instants; gocron's own
// DurationJob counts from each scheduler's start, and instances would not
// agree on its ticks.
//
// An [Elector] is a gocron.Elector over fence's leader election: only the
// instance that holds the term runs jobs, and its tasks fence their writes
// with the term ([Elector.Term]), a guard.Lease whose context ends with
// the term.
package gocrontick
