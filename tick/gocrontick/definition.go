package gocrontick

import (
	"fmt"
	"time"

	"github.com/fencelock/fencelock/tick"
	"github.com/go-co-op/gocron/v2"
	"github.com/robfig/cron/v3"
)

// Definition is a job's schedule for both gocron (its JobDefinition) and
// package tick (its Schedule): made by [Cron] or [Every].
type Definition struct {
	def   gocron.JobDefinition
	sched tick.Schedule
	start func(now time.Time) gocron.JobOption // nil: gocron's own start
}

// Schedule is the definition's schedule as package tick sees it.
func (d Definition) Schedule() tick.Schedule { return d.sched }

// Cron is a crontab job ("*/5 * * * *"; with withSeconds, a leading
// seconds field), parsed by the parser gocron uses, so that gocron fires
// and package tick names the same instants. A spec without CRON_TZ is
// read in time.Local, as gocron reads it on a scheduler without
// gocron.WithLocation; on a scheduler with another location, name the
// zone in the spec ("CRON_TZ=Europe/Paris 30 2 * * *"), or the ticks
// gocron fires are not the spec's and tick.Runner.Run refuses them.
func Cron(spec string, withSeconds bool) (Definition, error) {
	fields := cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor
	if withSeconds {
		fields |= cron.Second
	}
	s, err := cron.NewParser(fields).Parse(spec)
	if err != nil {
		return Definition{}, fmt.Errorf("%w: Cron(%q): %v", ErrInvalidInput, spec, err)
	}
	if ss, ok := s.(cron.ConstantDelaySchedule); ok {
		return Definition{}, fmt.Errorf("%w: Cron(%q): @every counts from each instance's start, so instances do not agree on its ticks: use gocrontick.Every(%v)", ErrInvalidInput, spec, ss.Delay)
	}
	return Definition{def: gocron.CronJob(spec, withSeconds), sched: s}, nil
}

// Every is a duration job on the ticks of tick.Every(period): the
// multiples of period since the Unix epoch. gocron starts it on the next
// such tick, so every instance fires at the same instants.
func Every(period time.Duration) (Definition, error) {
	if period <= 0 {
		return Definition{}, fmt.Errorf("%w: Every(%v): the period must be positive", ErrInvalidInput, period)
	}
	e := tick.Every(period)
	return Definition{def: gocron.DurationJob(period), sched: e, start: func(now time.Time) gocron.JobOption {
		return gocron.WithStartAt(gocron.WithStartDateTime(e.Next(now)))
	}}, nil
}
