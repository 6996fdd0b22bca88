// Package crontick runs robfig/cron v3 jobs as ticks of package tick: every
// instance schedules the same job on its own *cron.Cron, and each tick runs
// once across them, fenced to the database. It is a module of its own
// (github.com/fencelock/fencelock/tick/crontick), so that the library's
// go.mod carries no scheduler.
//
//	c := cron.New()
//	s, err := cron.ParseStandard("CRON_TZ=Europe/Paris 30 2 * * *")
//	id, err := crontick.Add(c, runner, "stock-sync", s, func(ctx context.Context, t *tick.Tick[pgfence.Run]) error {
//		... // t.At is the tick, t.Run its resumable run, t.Lock the job's lock
//	})
//	c.Start()
//
// # The tick
//
// robfig's Job.Run receives nothing, so the job learns its tick from its
// entry: when cron starts a job it records the instant it fired for as the
// entry's Prev, and the job reads it (Cron.Entry) before it calls
// tick.Runner.Run. The tick is therefore the instant the schedule named,
// never the time the goroutine happened to start. A spec with CRON_TZ names
// instants in that zone: on the night an hour repeats, both of its
// instants are ticks (robfig fires at each); on the night it is skipped,
// neither.
//
// Use a schedule that every instance computes alike: a spec, or
// tick.Every (a cron.Schedule too), aligned to the Unix epoch. robfig's
// "@every 5m" (ConstantDelaySchedule) counts from each instance's start:
// instances would not agree on the ticks, and Add refuses it.
//
// Outcomes and errors go to [WithReport]'s function; without it, errors
// are logged with slog.Default() (Job.Run returns nothing).
package crontick
