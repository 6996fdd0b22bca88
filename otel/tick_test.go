package fencelockotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/tick"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
)

// A tick run counts by outcome; ticks no instance ran count as missed,
// once, by the job's name.
func TestTickMetrics(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	r, err := tick.New(e.client(t), e.store(t), tick.WithObserver(e.obs))
	require.NoError(t, err)
	every := tick.Every(time.Minute)
	at := tick.Prev(every, time.Now()).Add(-time.Hour)
	noop := func(context.Context, *tick.Tick[pgfence.Run]) error { return nil }
	for _, tk := range []time.Time{at, at, at.Add(4 * time.Minute)} {
		_, err := r.Run(ctx, "stock-sync", every, tk, noop)
		require.NoError(t, err)
	}
	rm := e.collect(t)
	job := attribute.String("fencelock.tick.job", "stock-sync")
	assert.Equal(t, int64(2), count(t, rm, "fencelock.tick.runs", job, outcome("ran")))
	assert.Equal(t, int64(1), count(t, rm, "fencelock.tick.runs", job, outcome("already_done")))
	assert.Equal(t, int64(3), count(t, rm, "fencelock.tick.missed", job))
}
