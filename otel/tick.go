package fencelockotel

import (
	"context"
	"strings"

	"github.com/fencelock/fencelock/tick"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// KeyJob is the attribute of a scheduled job's name. Tick metrics always
// carry it: a service has a handful of fixed jobs, and a missed tick is
// looked for per job.
const KeyJob = attribute.Key("fencelock.tick.job")

var (
	_ tick.RunObserver  = (*Observer)(nil)
	_ tick.MissObserver = (*Observer)(nil)
)

// tickInstruments counts scheduled jobs' ticks.
type tickInstruments struct {
	runs   metric.Int64Counter
	missed metric.Int64Counter
}

func (o *Observer) tickInstruments(m metric.Meter, add func(error)) {
	var err error
	o.tick.runs, err = m.Int64Counter("fencelock.tick.runs", metric.WithUnit("{tick}"),
		metric.WithDescription("tick.Runner.Run calls by outcome: ran, already_done, held_elsewhere, superseded, error."))
	add(err)
	o.tick.missed, err = m.Int64Counter("fencelock.tick.missed", metric.WithUnit("{tick}"),
		metric.WithDescription("Ticks of scheduled jobs that no instance ran, counted by the call that started the next tick."))
	add(err)
}

// OnTickRun implements tick.RunObserver: a count by outcome.
func (o *Observer) OnTickRun(ctx context.Context, e tick.RunEvent) {
	outcome := "error"
	if e.Err == nil {
		outcome = strings.ReplaceAll(e.Result.String(), " ", "_")
	}
	o.tick.runs.Add(ctx, 1, o.fixed(KeyJob.String(e.Job), KeyOutcome.String(outcome)))
}

// OnTickMissed implements tick.MissObserver: the missed ticks' count.
func (o *Observer) OnTickMissed(ctx context.Context, e tick.MissedEvent) {
	o.tick.missed.Add(ctx, e.Count, o.fixed(KeyJob.String(e.Job)))
}
