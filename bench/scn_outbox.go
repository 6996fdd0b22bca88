package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/pgfence"
)

// runOutbox measures the outbox: what an effect adds to a guarded
// transaction (direct and behind a 1 ms proxy), how long a committed
// effect takes to reach the Sender (woken in-process, and found by polling
// alone), and how fast one relay and two drain a backlog to a no-op
// Sender.
func runOutbox(ctx context.Context, e *env, res *results) error {
	s := res.scenario("outbox")
	db, err := e.newPGDB(ctx, true)
	if err != nil {
		return err
	}
	defer db.close(ctx, e)
	if _, err := db.direct.Exec(ctx, `CREATE TABLE bench_rows (id bigserial PRIMARY KEY, resource text NOT NULL, qty int NOT NULL)`); err != nil {
		return err
	}
	lock, err := e.fence.c.Acquire(ctx, "outbox-bench")
	if err != nil {
		return err
	}
	defer lock.Release(context.WithoutCancel(ctx)) //nolint:errcheck
	if err := outboxCost(ctx, e, db, s, lock); err != nil {
		return err
	}
	if err := outboxLatency(ctx, e, db, s, lock); err != nil {
		return err
	}
	if err := outboxRiver(ctx, e, db, s); err != nil {
		return fmt.Errorf("river: %w", err)
	}
	return outboxThroughput(ctx, e, db, s)
}

// outboxCost: guarded one-row transactions with and without one effect,
// interleaved, no relay running.
func outboxCost(ctx context.Context, e *env, db *pgDB, s *scenario, lease guard.Lease) error {
	var seq atomic.Int64
	for _, path := range []struct {
		name string
		pool *pgxpool.Pool
		n    int
	}{{"direct", db.direct, e.cfg.GuardTxDirect}, {"proxied 1ms each way", db.proxied, e.cfg.GuardTxProxied}} {
		store, err := pgfence.New(path.pool)
		if err != nil {
			return err
		}
		if path.pool == db.proxied {
			db.proxy.Delay(e.cfg.ProxyDelay)
		}
		write := func(effect bool) func(ctx context.Context) error {
			return func(ctx context.Context) error {
				_, err := guard.Exec(ctx, store, lease, func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, guardInsert, "outbox-bench", 1); err != nil {
						return err
					}
					if !effect {
						return nil
					}
					return outbox.Add(ctx, tx, outbox.Effect{Destination: "bench", Key: "k-" + strconv.FormatInt(seq.Add(1), 10), Payload: []byte(`{"sku-1":5}`)})
				})
				return err
			}
		}
		repMed, pooled, err := interleaved(ctx, e.cfg.Reps, path.n, []op{{"guarded", write(false)}, {"guarded+effect", write(true)}})
		if err != nil {
			return fmt.Errorf("%s: %w", path.name, err)
		}
		for _, v := range []string{"guarded", "guarded+effect"} {
			s.set(path.name+": "+v, "tx_latency_us", newFigure("µs", repMed[v], pooled[v]))
		}
		s.Ratios["guarded+effect/guarded "+path.name] = pairedRatio(repMed["guarded+effect"], repMed["guarded"])
	}
	db.proxy.Delay(0)
	_, err := db.direct.Exec(ctx, `TRUNCATE fencelock.outbox`)
	return err
}

// stamped is a Sender that notes when each effect reached it.
type stamped struct {
	mu  sync.Mutex
	at  map[string]time.Time
	got chan string
}

func (st *stamped) Send(_ context.Context, d outbox.Delivery) error {
	now := time.Now()
	st.mu.Lock()
	st.at[d.Key] = now
	st.mu.Unlock()
	st.got <- d.Key
	return nil
}

// outboxLatency: one effect at a time, from the start of its commit (fn
// has returned) to the Sender's call. In-process: guard.Exec with
// outbox.Add, which wakes the relay at the commit. Poll-only: the same
// row written by raw SQL (nothing wakes the relay), found by the relay's
// poll at its default interval.
func outboxLatency(ctx context.Context, e *env, db *pgDB, s *scenario, lease guard.Lease) error {
	st := &stamped{at: map[string]time.Time{}, got: make(chan string, 16)}
	relay, err := outbox.NewRelay(db.direct, st, outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	defer func() { stop(); <-done }()
	store, err := pgfence.New(db.direct)
	if err != nil {
		return err
	}
	wait := func(key string) error {
		for {
			select {
			case k := <-st.got:
				if k == key {
					return nil
				}
			case <-time.After(10 * time.Second):
				return fmt.Errorf("effect %s not sent within 10s", key)
			}
		}
	}
	var seq int
	inProcess := func() (time.Duration, error) {
		seq++
		key := "lat-" + strconv.Itoa(seq)
		var start time.Time
		_, err := guard.Exec(ctx, store, lease, func(ctx context.Context, tx pgx.Tx) error {
			if err := outbox.Add(ctx, tx, outbox.Effect{Destination: "bench", Key: key}); err != nil {
				return err
			}
			start = time.Now()
			return nil
		})
		if err != nil {
			return 0, err
		}
		if err := wait(key); err != nil {
			return 0, err
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.at[key].Sub(start), nil
	}
	pollOnly := func() (time.Duration, error) {
		seq++
		// Commit at a random moment of the relay's poll cycle, as
		// effects of other processes do: the last one was sent right
		// after a poll.
		time.Sleep(time.Duration(rand.Int64N(int64(outbox.DefaultPollInterval))))
		key := "poll-" + strconv.Itoa(seq)
		tx, err := db.direct.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `SELECT fencelock.claim($1, $2, $3)`, lease.Name(), lease.Token(), lease.Holder()); err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, `SELECT fencelock.outbox_add($1::jsonb)`, `[{"d":"bench","k":"`+key+`"}]`); err != nil {
			return 0, err
		}
		start := time.Now()
		if err := tx.Commit(ctx); err != nil {
			return 0, err
		}
		if err := wait(key); err != nil {
			return 0, err
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.at[key].Sub(start), nil
	}
	for _, m := range []struct {
		name string
		n    int
		f    func() (time.Duration, error)
	}{{"in-process wake-up", e.cfg.OutboxLatencyN, inProcess}, {"poll-only", e.cfg.OutboxPollN, pollOnly}} {
		var repMed, repP99, pooled []float64
		for rep := 0; rep < e.cfg.Reps; rep++ {
			var samples []float64
			for i := 0; i < m.n; i++ {
				d, err := m.f()
				if err != nil {
					return fmt.Errorf("%s: %w", m.name, err)
				}
				samples = append(samples, us(d))
			}
			d := summarize(samples)
			repMed, repP99 = append(repMed, d.Median), append(repP99, d.P99)
			pooled = append(pooled, samples...)
		}
		s.set("commit → Sender, "+m.name, "latency_us", newFigure("µs", repMed, pooled))
		s.set("commit → Sender, "+m.name, "p99_us", newFigure("µs", repP99, nil))
	}
	s.Notes = append(s.Notes, fmt.Sprintf("commit → Sender: from the start of the commit round trip to the Sender's call, one effect at a time; poll-only at the default poll interval (%v)", outbox.DefaultPollInterval))
	return nil
}

// outboxThroughput: a backlog drained by one relay, then by two, to a
// no-op Sender, at the default batch size and concurrency.
func outboxThroughput(ctx context.Context, e *env, db *pgDB, s *scenario) error {
	var one, two []float64
	for rep := 0; rep < e.cfg.Reps; rep++ {
		for _, relays := range []int{1, 2} {
			rate, err := drain(ctx, db.direct, e.cfg.OutboxBacklog, relays)
			if err != nil {
				return fmt.Errorf("%d relays: %w", relays, err)
			}
			if relays == 1 {
				one = append(one, rate)
			} else {
				two = append(two, rate)
			}
		}
	}
	s.set("one relay", "effects_per_s", newFigure("effects/s", one, nil))
	s.set("two relays", "effects_per_s", newFigure("effects/s", two, nil))
	s.Ratios["two relays/one relay"] = pairedRatio(two, one)
	s.Notes = append(s.Notes, fmt.Sprintf("throughput: a backlog of %d rows drained to a no-op Sender, relays at their defaults (batch %d, concurrency %d)",
		e.cfg.OutboxBacklog, outbox.DefaultBatchSize, outbox.DefaultConcurrency))
	return nil
}

// drain writes a backlog of n due rows, then runs relays until every row
// is delivered, and returns the effects per second.
func drain(ctx context.Context, pool *pgxpool.Pool, n, relays int) (float64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT fencelock.claim('outbox-drain', 1, 'bench')`); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload)
		SELECT 'outbox-drain', 1, 'bench', 'bench', 'k' || g, '\x00' FROM generate_series(1, $1) g`, n); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE fencelock.outbox`); err != nil {
		return 0, err
	}
	var sent atomic.Int64
	all := make(chan struct{})
	sender := outbox.SenderFunc(func(context.Context, outbox.Delivery) error {
		if sent.Add(1) == int64(n) {
			close(all)
		}
		return nil
	})
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	start := time.Now()
	for range relays {
		r, err := outbox.NewRelay(pool, sender, outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			stop()
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = r.Run(rctx)
		}()
	}
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
	}
	elapsed := time.Since(start)
	stop()
	wg.Wait()
	if got := sent.Load(); got < int64(n) {
		return 0, fmt.Errorf("only %d of %d effects sent in %v", got, n, elapsed)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.outbox`).Scan(&left); err != nil {
		return 0, err
	}
	if left > 0 {
		return 0, fmt.Errorf("%d rows left in the outbox after every effect was sent", left)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// riverArgs is the River job of the peer measurement: one effect.
type riverArgs struct {
	Key string `json:"key"`
}

func (riverArgs) Kind() string { return "bench_effect" }

type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	st *stamped
}

func (w *riverWorker) Work(ctx context.Context, job *river.Job[riverArgs]) error {
	d := outbox.Delivery{Key: job.Args.Key}
	return w.st.Send(ctx, d)
}

// outboxRiver is the peer: River's InsertTx in a transaction, then its
// worker called, at River's defaults (pgx v5 driver: LISTEN/NOTIFY on, fetch
// poll 1 s), one job at a time, from the start of COMMIT to Work.
func outboxRiver(ctx context.Context, e *env, db *pgDB, s *scenario) error {
	driver := riverpgxv5.New(db.direct)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	st := &stamped{at: map[string]time.Time{}, got: make(chan string, 16)}
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverWorker{st: st})
	client, err := river.NewClient(driver, &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 100}},
		Workers: workers,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()
	var repMed, pooled []float64
	seq := 0
	for rep := 0; rep < e.cfg.Reps; rep++ {
		var samples []float64
		for i := 0; i < e.cfg.OutboxPollN; i++ {
			seq++
			key := "river-" + strconv.Itoa(seq)
			tx, err := db.direct.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := client.InsertTx(ctx, tx, riverArgs{Key: key}, nil); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			start := time.Now()
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			select {
			case k := <-st.got:
				if k != key {
					return fmt.Errorf("river: got %s, want %s", k, key)
				}
			case <-time.After(30 * time.Second):
				return fmt.Errorf("river: job %s not worked within 30s", key)
			}
			st.mu.Lock()
			samples = append(samples, us(st.at[key].Sub(start)))
			st.mu.Unlock()
		}
		repMed = append(repMed, median(samples))
		pooled = append(pooled, samples...)
	}
	s.set("River InsertTx → worker", "latency_us", newFigure("µs", repMed, pooled))
	s.Ratios["outbox in-process/River"] = med(s, "commit → Sender, in-process wake-up") / median(repMed)
	s.Notes = append(s.Notes, "River v0.51.2 at its defaults (riverpgxv5: LISTEN/NOTIFY, fetch cooldown 100 ms, fetch poll 1 s; MaxWorkers 100), one job at a time, from the start of COMMIT to Work")
	return nil
}

// med is the median of a scenario's latency figure, NaN if missing.
func med(s *scenario, lib string) float64 {
	if f := s.get(lib, "latency_us"); f != nil {
		return f.Median
	}
	return math.NaN()
}
