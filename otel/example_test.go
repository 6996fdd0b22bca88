package fencelockotel_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/migrations"
	fencelockotel "github.com/fencelock/fencelock/otel"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// A stock-sync worker with its metrics on a Prometheus /metrics endpoint.
// A scripted late writer shows what the metrics are for: worker A writes
// batch 1 and then stalls past its lease; worker B takes over, finds batch
// 1 already applied and writes batch 2; A wakes up and writes with the
// token it still has: the database refuses it, and /metrics says so.
func Example_prometheus() {
	ctx := context.Background()
	redisURL, databaseURL, cleanup := exampleServers()
	defer cleanup()

	// Metrics: an OpenTelemetry MeterProvider that Prometheus scrapes.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	must(err)
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer provider.Shutdown(ctx)
	metrics := httptest.NewServer(promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	defer metrics.Close()

	// One observer for the lock client and the store.
	obs, err := fencelockotel.New(fencelockotel.WithMeterProvider(provider))
	must(err)
	redisOpts, err := redis.ParseURL(redisURL)
	must(err)
	rdb := redis.NewClient(redisOpts)
	defer rdb.Close()
	locks, err := fence.New(rdb, fence.WithObserver(obs))
	must(err)
	defer locks.Close(ctx)
	pool, err := pgxpool.New(ctx, databaseURL)
	must(err)
	defer pool.Close()
	store, err := pgfence.New(pool, pgstore.WithObserver(obs))
	must(err)

	batch := func(sku string) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO stock (sku, qty) VALUES ($1, 1)", sku)
			return err
		}
	}

	// Worker A writes batch 1, then stalls until its lease is over. The
	// lease leaves the write ample time on a loaded machine: the lock is
	// lost after the write, not during it.
	a, err := locks.Acquire(ctx, "stock-sync:eu", fence.WithFixedLease(2*time.Second))
	must(err)
	_, err = guard.Exec(ctx, store, a, batch("sku-1"), guard.WithKey("batch-1"))
	must(err)
	late := lateWriter{name: a.Name(), holder: a.Holder(), token: a.Token()}
	<-a.Done()

	// Worker B takes over.
	b, err := locks.Acquire(ctx, "stock-sync:eu")
	must(err)
	_, err = guard.Exec(ctx, store, b, batch("sku-1"), guard.WithKey("batch-1"))
	fmt.Println("B, batch 1 again:", errors.Is(err, guard.ErrAlreadyApplied))
	_, err = guard.Exec(ctx, store, b, batch("sku-2"), guard.WithKey("batch-2"))
	fmt.Println("B, batch 2:", err)

	// A wakes up and writes with its old token.
	_, err = guard.Exec(ctx, store, late, batch("sku-2"))
	fmt.Println("A, late write refused:", errors.Is(err, guard.ErrStaleToken))
	must(b.Release(ctx))

	// Scrape /metrics as Prometheus would; print the write and
	// acquisition counters (the histograms' sums vary from run to run).
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(metrics.URL + "/metrics")
	must(err)
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if line := lines.Text(); strings.HasPrefix(line, "fencelock_guard_execs_total") ||
			strings.HasPrefix(line, "fencelock_lock_acquisitions_total") {
			fmt.Println(line)
		}
	}
	must(lines.Err())
	// Output:
	// B, batch 1 again: true
	// B, batch 2: <nil>
	// A, late write refused: true
	// fencelock_guard_execs_total{fencelock_outcome="committed",fencelock_reason="none"} 2
	// fencelock_guard_execs_total{fencelock_outcome="rejected",fencelock_reason="already_applied"} 1
	// fencelock_guard_execs_total{fencelock_outcome="rejected",fencelock_reason="stale_token"} 1
	// fencelock_lock_acquisitions_total{fencelock_outcome="acquired"} 2
}

// lateWriter is what a stalled writer has left: the lock's name, holder
// and the token it was given. It knows nothing of the lease it lost.
type lateWriter struct {
	name, holder string
	token        int64
}

func (l lateWriter) Name() string   { return l.name }
func (l lateWriter) Token() int64   { return l.token }
func (l lateWriter) Holder() string { return l.holder }

// exampleServers starts a throwaway Redis and a database with the
// fencelock schema and a stock table; in a real program these are your
// servers, and migrations.Up runs once per database.
func exampleServers() (redisURL, databaseURL string, cleanup func()) {
	ctx := context.Background()
	rds, err := testenv.StartRedis()
	must(err)
	pg, err := testenv.SharedPostgres() // stopped by testenv.Main
	must(err)
	name, databaseURL, err := pg.CreateDatabase(ctx)
	must(err)
	pool, err := pgxpool.New(ctx, databaseURL)
	must(err)
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	must(migrations.Up(ctx, sqlDB))
	must(sqlDB.Close())
	_, err = pool.Exec(ctx, "CREATE TABLE stock (sku text, qty int)")
	must(err)
	return rds.URL, databaseURL, func() {
		_ = rds.Stop()
		_ = pg.DropDatabase(ctx, name)
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
