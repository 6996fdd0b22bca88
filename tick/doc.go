// Package tick runs a scheduled job's ticks once across every instance
// that runs the same schedule: each instance's scheduler (gocron, robfig's
// cron, a Kubernetes CronJob, a loop over [Every]) calls [Runner.Run] for
// the tick it fired for, and one call runs the job while the others learn
// that it ran. The tick's work is a resumable run of the Postgres store
// (pgfence or sqlfence) keyed by the job and the tick, under the job's
// fence lock: the database refuses a second application of the tick and
// the writes of a holder that lost the lock, and a holder that takes over
// from one that died resumes at its cursor.
//
//	runner, err := tick.New(locks, store) // a *fence.Client, a *pgfence.Store
//	out, err := runner.Run(ctx, "stock-sync", tick.Every(5*time.Minute), scheduled,
//		func(ctx context.Context, t *tick.Tick[pgfence.Run]) error {
//			return t.Run.Step(ctx, "done", func(ctx context.Context, tx pgx.Tx) error { ... })
//		})
//
// What was decided and why, the adapters for gocron and robfig's cron
// (modules of their own), and a Kubernetes CronJob's pod are in
// docs/scheduled-jobs.md
// (https://github.com/fencelock/fencelock/blob/main/docs/scheduled-jobs.md).
//
// # The tick
//
// A tick is the instant the schedule names, in UTC: its run key is that
// instant in RFC 3339 ([Key]). It never comes from the local firing time
// as such, so daylight saving (an hour repeated or skipped in local time)
// and instances in other time zones agree: a cron schedule with a zone
// ("CRON_TZ=Europe/Paris 30 2 * * *") names instants, and on the autumn
// night whose 02:30 happens twice, each of its instants is a tick of its
// own (robfig's cron fires once per instant its rules match; on the spring
// night without 02:30 it fires at none). Pass the instant the scheduler
// fired for; an instance that only knows its firing time may pass that,
// within the tolerance ([WithTolerance], default [DefaultTolerance] or a
// quarter of the gap between ticks): Run snaps it to the nearest tick.
// Instances whose clocks (and firing delays) differ by less than the
// tolerance therefore agree on the tick. An instant farther from every
// tick, a tick further in the future of the instance's clock than the
// tolerance, a tolerance not below half the gap between ticks, a zero
// instant or an empty job name are refused ([ErrInvalidInput],
// [ErrInvalidOption]) before anything is taken.
//
// # One run per tick
//
// The job's lock is named after the job, and its runs live under that
// resource: the tick's run ([Key]) and the job's ledger ([LedgerKey]), a
// run that is never finished whose cursor records the newest tick
// started, whether it finished and by which token, and the last missed
// ticks. Run waits for the lock (see "Waiting"), reads the ledger, and:
//
//   - the tick is the newest and finished, or older and its run finished:
//     [AlreadyDone], with the token that finished it ([Outcome.Token]);
//   - older than the newest and not finished: [Superseded] (see "Ticks
//     in order");
//   - the newest, in flight (its runner died, or its job failed): resumed
//     at its run's cursor ([Tick.Resumed], [Tick.Cursor]), then finished;
//   - newer: the ticks between the newest and it that are still due run
//     first, in order; the others are missed (recorded and reported); then
//     it is recorded as started, run, finished: [Ran].
//
// The job's Func writes through the tick's run, [Tick.Run] (Step commits
// its writes and its cursor in one fenced transaction); Run finishes the
// run when Func returns nil. A Func that fails leaves the tick open at its
// last step's cursor, and the error is a [*JobError]: the next holder
// resumes it. Before deciding anything that writes, Run claims the fence
// (the store's Advance): a paused holder of the tick that wakes up cannot
// commit a step after the next holder read the cursor.
//
// # Ticks in order
//
// A job's ticks run in the order of the schedule: an older tick starting
// after a newer one would write older data over newer. A tick is due from
// its instant until its callers' wait ends (see "Waiting": by default,
// when the next tick is due). A call that holds the lock for a tick runs
// first, in order, the ticks between the newest started and its own that
// are still due by its clock ([Outcome.Earlier]): their own callers may
// still be queued behind it (a clock ahead, a waiter that was slow to
// heartbeat and lost its place) and then find them done. The ticks whose
// wait is over are missed. A tick older than the newest started, not
// finished, is never run: Superseded.
//
// # A job's first tick
//
// A job's ledger is empty until its first tick starts, and that tick
// starts the job's history: the ticks before it are neither run nor
// counted missed (nothing says the job was scheduled then), and a call
// for one of them afterwards returns Superseded. Instances that fire the
// same first tick queue for it as for any other; only an older tick's
// call that comes after a newer tick started (its instance lagged by
// more than a period, or lost the lock before it recorded the tick
// started) finds it superseded. Deleting the ledger's row starts the
// history again the same way.
//
// # Waiting
//
// Instances fire a tick at slightly different times (clocks, load, a
// ticker that fired late), and only one holds the lock. The others wait
// in the lock's fair queue, by default until the next tick is due
// ([WithWait] sets another bound): they take the lock after the runner
// released it and see the tick done, or, when the runner died, take over
// once its lease ran out ([WithLockOptions] with fence.WithLease: a short
// lease resumes sooner) and resume it. A call whose wait ends with the
// lock still held returns [HeldElsewhere].
//
// # A job longer than its period
//
// The next tick waits; past its wait it is skipped, never run beside.
// Its callers queue for the job's lock while the long tick runs, and run
// it late if the long one ends before their wait does (by default, before
// the tick after is due); otherwise they return HeldElsewhere, and the
// tick is reported missed when a later one starts. Two ticks of one job
// never run at once: they would write the same data, and only one holder
// of the job's fence can commit.
//
// # A tick in flight during a rolling deploy
//
// An instance stopped while it runs a tick leaves the tick's run open at
// its last committed step. If it released the lock (a graceful stop that
// cancels Run's ctx), an instance still waiting for that tick takes the
// lock at once; if it died, the lock frees when its lease runs out. The
// holder resumes the tick at its cursor. If no instance was waiting any
// more, the next call for a later tick finishes it first, at its cursor,
// then runs its own ([Outcome.Earlier]): no tick is left half-done while
// the job goes on. A tick whose job keeps failing therefore holds up the
// later ticks of its job, each call returning the failure as a JobError,
// until the job is fixed.
//
// # Catching up after every instance was down
//
// None by default: the ticks that fell while no instance ran, and whose
// wait is over, are reported missed when the next tick starts, and that
// tick does the work (a stock
// sync of now supersedes the syncs that did not happen). To run the last
// missed tick at start-up instead, call Run for [Prev](schedule, now): it
// runs once across the instances that start together, and is AlreadyDone
// when some instance ran it.
//
// # Retention
//
// Pruning finished runs (the stores' Prune, fencectl runs prune) cannot
// re-open a tick: a tick older than the job's newest is never started, and
// the ledger, never finished, is never pruned. A call for a pruned tick
// returns Superseded (or, for the newest tick, AlreadyDone from the
// ledger's record).
//
// # Missed ticks
//
// A tick is missed when no instance ran it: all were down, or the lock
// stayed held past every caller's wait. The call that starts the next
// tick counts them from the schedule ([Outcome.Missed]), records the last
// runs of them in the ledger (fencectl ticks list shows them) and tells
// the [MissObserver]s ([WithObserver]; the otel module counts them).
//
// # Leaders
//
// A Runner needs no leader: every instance may call Run. To have one
// scheduler instance at a time instead, campaign with fence's election and
// run the scheduler only while the term lasts (the gocron adapter's Elector
// does; see docs/leaders.md); ticks run through a Runner stay once-only
// when leadership moves mid-tick.
package tick
