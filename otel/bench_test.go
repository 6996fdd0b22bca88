package fencelockotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	fencelockotel "github.com/fencelock/fencelock/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkOnExec is the observer's cost per guarded write (metrics and a
// span on the real SDK, spans sampled and dropped), to compare with a
// guarded write's round trips (about a millisecond).
func BenchmarkOnExec(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = mp.Shutdown(context.Background()); _ = tp.Shutdown(context.Background()) }()
	obs, err := fencelockotel.New(fencelockotel.WithMeterProvider(mp), fencelockotel.WithTracerProvider(tp))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	ok := guard.ExecEvent{Resource: "stock-sync:eu", Token: 1, Holder: "h", Key: "batch-7",
		Outcome: guard.Committed, Duration: time.Millisecond}
	stale := ok
	stale.Outcome, stale.Reason, stale.Err = guard.Rejected, guard.ReasonStaleToken, errors.New("stale")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			obs.OnExec(ctx, ok)
		} else {
			obs.OnExec(ctx, stale)
		}
	}
}
