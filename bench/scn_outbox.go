package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
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

// outboxThroughput: a backlog drained by one relay process, then by two,
// to a no-op Sender, at the default batch size and concurrency.
func outboxThroughput(ctx context.Context, e *env, db *pgDB, s *scenario) error {
	var one, two, cpuOne, cpuTwo []float64
	// The relay processes live through every repetition.
	var cs []*child
	defer func() { stopAll(cs) }()
	for range 2 {
		c, err := startChild(ctx, role{Kind: "relay", Postgres: db.url})
		if err != nil {
			return err
		}
		cs = append(cs, c)
	}
	for rep := 0; rep < e.cfg.Reps; rep++ {
		for _, relays := range []int{1, 2} {
			rate, cpu, err := drain(ctx, db, cs[:relays], e.cfg.OutboxBacklog)
			if err != nil {
				return fmt.Errorf("%d relays: %w", relays, err)
			}
			if relays == 1 {
				one, cpuOne = append(one, rate), append(cpuOne, cpu)
			} else {
				two, cpuTwo = append(two, rate), append(cpuTwo, cpu)
			}
		}
	}
	s.set("one relay", "effects_per_s", newFigure("effects/s", one, nil))
	s.set("one relay", "relay_cpu_pct_core", newFigure("% of one core", cpuOne, nil))
	s.set("two relays", "effects_per_s", newFigure("effects/s", two, nil))
	s.set("two relays", "relay_cpu_pct_core", newFigure("% of one core", cpuTwo, nil))
	s.Ratios["two relays/one relay"] = pairedRatio(two, one)
	s.Notes = append(s.Notes, fmt.Sprintf("throughput: a backlog of %d rows drained to a no-op Sender by relay processes (each its own pgxpool, as deployed), at their defaults (batch %d, concurrency %d), from the go sent to every relay to the last effect's Sender call; relay_cpu_pct_core: the relay processes' CPU time (getrusage, all of it) over that span, in %% of one core",
		e.cfg.OutboxBacklog, outbox.DefaultBatchSize, outbox.DefaultConcurrency))
	return nil
}

// drain writes a backlog of n due rows, then runs the relay processes cs
// until every row is delivered: the effects per second, and the relays'
// CPU in % of one core.
func drain(ctx context.Context, db *pgDB, cs []*child, n int) (rate, cpuPct float64, err error) {
	if err := writeBacklog(ctx, db.direct, n); err != nil {
		return 0, 0, err
	}
	relays := len(cs)
	type line struct {
		i int
		s string
	}
	merged := make(chan line, 64)
	quit := make(chan struct{})
	defer close(quit) // a forwarder blocked on merged leaves
	var fwd sync.WaitGroup
	for i, c := range cs {
		fwd.Add(1)
		go func() {
			defer fwd.Done()
			for {
				l, err := c.next(ctx, 5*time.Minute)
				if err != nil {
					l = "error " + err.Error()
				}
				select {
				case merged <- line{i, l}:
				case <-quit:
					return
				}
				if err != nil || strings.HasPrefix(l, "cpu ") {
					return
				}
			}
		}()
	}
	go func() { fwd.Wait(); close(merged) }()
	start := time.Now()
	for _, c := range cs {
		if err := c.send("go"); err != nil {
			return 0, 0, err
		}
	}
	sent := make([]int64, relays)
	var last int64
	total := func() (t int64) {
		for _, v := range sent {
			t += v
		}
		return t
	}
	var cpu float64
	stopped := false
	for l := range merged {
		switch {
		case strings.HasPrefix(l.s, "error "):
			return 0, 0, errors.New(strings.TrimPrefix(l.s, "error "))
		case strings.HasPrefix(l.s, "sent "):
			f, err := parseInts(strings.TrimPrefix(l.s, "sent "))
			if err != nil || len(f) != 2 {
				return 0, 0, fmt.Errorf("relay said %q", l.s)
			}
			sent[l.i], last = f[0], max(last, f[1])
		case strings.HasPrefix(l.s, "cpu "):
			v, err := strconv.ParseFloat(strings.TrimPrefix(l.s, "cpu "), 64)
			if err != nil {
				return 0, 0, fmt.Errorf("relay said %q", l.s)
			}
			cpu += v
		}
		if !stopped && total() >= int64(n) {
			// Every effect was sent: the relays stop, finish their acks
			// and say their CPU time.
			stopped = true
			for _, c := range cs {
				if err := c.send("stop"); err != nil {
					return 0, 0, err
				}
			}
		}
	}
	if got := total(); got < int64(n) {
		return 0, 0, fmt.Errorf("only %d of %d effects sent", got, n)
	}
	elapsed := time.Unix(0, last).Sub(start)
	var left int
	if err := db.direct.QueryRow(ctx, `SELECT count(*) FROM fencelock.outbox`).Scan(&left); err != nil {
		return 0, 0, err
	}
	if left > 0 {
		return 0, 0, fmt.Errorf("%d rows left in the outbox after every effect was sent and the relays stopped", left)
	}
	return float64(n) / elapsed.Seconds(), 100 * cpu / elapsed.Seconds(), nil
}

func writeBacklog(ctx context.Context, pool *pgxpool.Pool, n int) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT fencelock.claim('outbox-drain', 1, 'bench')`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload)
		SELECT 'outbox-drain', 1, 'bench', 'bench', 'k' || g, '\x00' FROM generate_series(1, $1) g`, n); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `VACUUM ANALYZE fencelock.outbox`)
	return err
}

// relayRole: a relay on the role's database with a no-op Sender. On "go"
// it runs the relay, says "sent <n> <unix ns of the last send>" every 256
// effects and every 20 ms while n grows; on "stop" it stops the relay and
// says "cpu <seconds>" (its CPU time since the go, getrusage). It ends
// when its stdin closes.
func relayRole(r role, in *bufio.Scanner, out *lineWriter) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, r.Postgres)
	if err != nil {
		return err
	}
	defer pool.Close()
	var (
		mu          sync.Mutex
		sent, shown int64
		last        int64
	)
	report := func() {
		mu.Lock()
		n, at, show := sent, last, sent != shown
		shown = sent
		mu.Unlock()
		if show {
			out.say("sent %d %d", n, at)
		}
	}
	sender := outbox.SenderFunc(func(context.Context, outbox.Delivery) error {
		mu.Lock()
		sent++
		last = time.Now().UnixNano()
		every := sent%256 == 0
		mu.Unlock()
		if every {
			report()
		}
		return nil
	})
	relay, err := outbox.NewRelay(pool, sender, outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		return err
	}
	cmds := make(chan string)
	go func() {
		defer close(cmds)
		for in.Scan() {
			cmds <- in.Text()
		}
	}()
	out.say("ready")
	for cmd := range cmds {
		if cmd != "go" {
			return fmt.Errorf("want go, got %q", cmd)
		}
		mu.Lock()
		sent, shown = 0, 0
		mu.Unlock()
		cpu0 := cpuTime()
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- relay.Run(rctx) }()
		if err := relayUntilStop(cmds, done, report); err != nil {
			stop()
			<-done
			return err
		}
		stop()
		<-done
		report()
		out.say("cpu %f", cpuTime()-cpu0)
	}
	return nil
}

// relayUntilStop reports every 20 ms until the parent says stop.
func relayUntilStop(cmds <-chan string, done <-chan error, report func()) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			report()
		case err := <-done:
			return fmt.Errorf("relay stopped: %v", err)
		case cmd, ok := <-cmds:
			if !ok || cmd == "stop" {
				return nil
			}
			return fmt.Errorf("want stop, got %q", cmd)
		}
	}
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
	// p50 against p50, each over every sample of the run.
	s.Ratios["outbox in-process/River"] = p50(s, "commit → Sender, in-process wake-up") / summarize(pooled).Median
	s.Notes = append(s.Notes, "River v0.51.2 at its defaults (riverpgxv5: LISTEN/NOTIFY, fetch cooldown 100 ms, fetch poll 1 s; MaxWorkers 100), one job at a time, from the start of COMMIT to Work")
	return nil
}

// p50 is the median of every sample of a scenario's latency figure, NaN
// if missing.
func p50(s *scenario, lib string) float64 {
	if f := s.get(lib, "latency_us"); f != nil && f.Pooled != nil {
		return f.Pooled.Median
	}
	return math.NaN()
}
