package fencelockotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/migrations"
	fencelockotel "github.com/fencelock/fencelock/otel"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5/stdlib"
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

// BenchmarkExec is a guarded write on a real Postgres without an observer
// and with this one (metrics and a sampled span on the real SDK): the
// ratio of the two is the observer's share of a guarded write.
func BenchmarkExec(b *testing.B) {
	db := testenv.NewDB(b)
	ctx := context.Background()
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	if err := migrations.Up(ctx, sqlDB); err != nil {
		b.Fatal(err)
	}
	_ = sqlDB.Close()
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE stock (sku text, qty int)"); err != nil {
		b.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = mp.Shutdown(ctx); _ = tp.Shutdown(ctx) }()
	obs, err := fencelockotel.New(fencelockotel.WithMeterProvider(mp), fencelockotel.WithTracerProvider(tp))
	if err != nil {
		b.Fatal(err)
	}
	plain, err := pgfence.New(db.Pool)
	if err != nil {
		b.Fatal(err)
	}
	observed, err := pgfence.New(db.Pool, pgstore.WithObserver(obs))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name  string
		store *pgfence.Store
	}{{"plain", plain}, {"otel", observed}} {
		b.Run(bc.name, func(b *testing.B) {
			l := lateWriter{name: "bench-" + bc.name, holder: "h", token: 1}
			for b.Loop() {
				if _, err := guard.Exec(ctx, bc.store, l, insert("b")); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
