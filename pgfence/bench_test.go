package pgfence_test

import (
	"context"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The same one-row write, guarded and plain, directly and through a proxy
// that adds 1 ms each way (where round trips dominate). Compare with
//
//	go test -run '^$' -bench Exec -count 5 ./pgfence/ | tee bench.txt
//
// and the ratio of ExecGuarded to ExecPlain per sub-benchmark.

func benchPools(b *testing.B) map[string]*pgxpool.Pool {
	b.Helper()
	db := newDB(b)
	mustExec(b, db.Pool, "CREATE TABLE bench_stock (id bigserial PRIMARY KEY, sku text NOT NULL, qty int NOT NULL)")
	proxy, err := testenv.NewProxy(db.Server.Addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = proxy.Close() })
	proxy.Delay(time.Millisecond)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(proxy.Addr)
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	delayed, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(delayed.Close)
	return map[string]*pgxpool.Pool{"direct": db.Pool, "delay=1ms": delayed}
}

// clientCPU reports this process's CPU time (user and system) per
// operation as client-µs/op, when the benchmark ends: the client side of
// the cost (Postgres runs in processes of its own).
func clientCPU(b *testing.B) {
	b.Helper()
	start := cpuTime()
	b.Cleanup(func() {
		if b.N > 0 {
			b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(b.N), "client-µs/op")
		}
	})
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func writeOne(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, "INSERT INTO bench_stock (sku, qty) VALUES ($1, $2)", "sku-1", 5)
	return err
}

func BenchmarkExecPlain(b *testing.B) {
	for _, name := range []string{"direct", "delay=1ms"} {
		b.Run(name, func(b *testing.B) {
			pool := benchPools(b)[name]
			ctx := context.Background()
			b.ResetTimer()
			clientCPU(b)
			for b.Loop() {
				tx, err := pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := writeOne(ctx, tx); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkExecGuarded(b *testing.B) {
	for _, name := range []string{"direct", "delay=1ms"} {
		b.Run(name, func(b *testing.B) {
			pool := benchPools(b)[name]
			s := newStore(b, pool)
			ctx := context.Background()
			l := guardtest.Lease{Resource: "bench", Tok: 1, Who: "h"}
			b.ResetTimer()
			clientCPU(b)
			for b.Loop() {
				if _, err := guard.Exec(ctx, s, l, writeOne); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// With an idempotency key per write (a fresh key each time, so every
// write is applied): the key travels in the same round trip.
func BenchmarkExecGuardedKeyed(b *testing.B) {
	for _, name := range []string{"direct", "delay=1ms"} {
		b.Run(name, func(b *testing.B) {
			pool := benchPools(b)[name]
			s := newStore(b, pool)
			ctx := context.Background()
			l := guardtest.Lease{Resource: "bench", Tok: 1, Who: "h"}
			i := 0
			b.ResetTimer()
			clientCPU(b)
			for b.Loop() {
				i++
				if _, err := guard.Exec(ctx, s, l, writeOne, guard.WithKey("batch-"+strconv.Itoa(i))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
