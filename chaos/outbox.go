package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os/exec"
	"sync"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/outbox/outboxtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OutboxConfig configures RunOutbox: trials in which a writer records
// effects through guard.Exec and outbox.Add while two relay processes
// deliver them, one of them SIGKILLed at random points and started again.
type OutboxConfig struct {
	// Trials is the number of trials (default 1).
	Trials int
	// Seed drives the kills' timing and victims.
	Seed int64
	// Effects per trial (default 400), each sent twice: to a receiver
	// that fences (outbox.Receive) and to one that does not.
	Effects int
	// Kills per trial (default 5).
	Kills int
	// Batch is the relays' claim batch and concurrency (default 16).
	Batch int
	// Visibility is the relays' visibility timeout (default 2s); the
	// send timeout is a quarter of it.
	Visibility time.Duration
	// Poll is the relays' poll interval (default 50ms).
	Poll time.Duration
	// RelayCommand returns the command a relay process runs (the suite's
	// own binary, SelfCommand), whose main runs outboxtest.RelayMain when
	// outboxtest.IsRelayProcess.
	RelayCommand func() *exec.Cmd
	// Out receives one line per trial when Verbose.
	Out     io.Writer
	Verbose bool
}

// OutboxReport is what the relay trials found.
type OutboxReport struct {
	Seed    int64 `json:"seed"`
	Trials  int   `json:"trials"`
	Kills   int   `json:"kills"`
	Effects int   `json:"effects"`
	// Lost counts effects no receiver got: must be 0.
	Lost int `json:"lost"`
	// AppliedTwice counts effects the fenced receiver applied more than
	// once: must be 0.
	AppliedTwice int `json:"applied_twice"`
	// Duplicates counts extra deliveries at the unfenced receiver; at most
	// DuplicatesAllowed (the relays' concurrency per kill).
	Duplicates        int `json:"duplicates"`
	DuplicatesAllowed int `json:"duplicates_allowed"`
	// EarlyRedeliveries counts effects sent again before the claim that
	// sent them could have expired (the visibility timeout less the send
	// timeout after their first send): must be 0.
	EarlyRedeliveries int `json:"early_redeliveries"`
	// RedeliveryMS is the range of the gaps between an effect's first
	// delivery and its next one: a killed relay's rows come back after the
	// visibility timeout, within the poll interval when relays are idle.
	RedeliveryMinMS int64   `json:"redelivery_min_ms"`
	RedeliveryMaxMS int64   `json:"redelivery_max_ms"`
	VisibilityMS    int64   `json:"visibility_ms"`
	PollMS          int64   `json:"poll_ms"`
	ElapsedS        float64 `json:"elapsed_s"`
}

// Failed reports whether the trials broke the outbox's promise.
func (r *OutboxReport) Failed() bool {
	return r.Lost > 0 || r.AppliedTwice > 0 || r.Duplicates > r.DuplicatesAllowed || r.EarlyRedeliveries > 0
}

func (c *OutboxConfig) setDefaults() error {
	if c.Trials <= 0 {
		c.Trials = 1
	}
	if c.Effects <= 0 {
		c.Effects = 400
	}
	if c.Kills <= 0 {
		c.Kills = 5
	}
	if c.Batch <= 0 {
		c.Batch = 16
	}
	if c.Visibility <= 0 {
		c.Visibility = 2 * time.Second
	}
	if c.Poll <= 0 {
		c.Poll = 50 * time.Millisecond
	}
	if c.RelayCommand == nil {
		return errors.New("chaos: RelayCommand is required (re-execute the binary: see SelfCommand)")
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	return nil
}

// RunOutbox runs the relay trials on a Postgres of their own.
func RunOutbox(ctx context.Context, cfg OutboxConfig) (*OutboxReport, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	pg, err := testenv.StartPostgres()
	if err != nil {
		return nil, err
	}
	defer func() { _ = pg.Stop() }()
	rep := &OutboxReport{Seed: cfg.Seed, VisibilityMS: cfg.Visibility.Milliseconds(), PollMS: cfg.Poll.Milliseconds()}
	for i := range cfg.Trials {
		t, err := outboxTrial(ctx, pg, &cfg, rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i))))
		if err != nil {
			return nil, fmt.Errorf("chaos: outbox trial %d: %w", i, err)
		}
		rep.add(t)
		if cfg.Verbose {
			fmt.Fprintf(cfg.Out, "outbox trial %d: %d kills, %d effects, lost %d, applied twice %d, duplicates %d (allowed %d), early redeliveries %d, redelivery %d-%d ms\n",
				i, t.Kills, t.Effects, t.Lost, t.AppliedTwice, t.Duplicates, t.DuplicatesAllowed, t.EarlyRedeliveries, t.RedeliveryMinMS, t.RedeliveryMaxMS)
		}
	}
	rep.ElapsedS = time.Since(start).Round(100 * time.Millisecond).Seconds()
	return rep, nil
}

func (r *OutboxReport) add(t *OutboxReport) {
	r.Trials++
	r.Kills += t.Kills
	r.Effects += t.Effects
	r.Lost += t.Lost
	r.AppliedTwice += t.AppliedTwice
	r.Duplicates += t.Duplicates
	r.DuplicatesAllowed += t.DuplicatesAllowed
	r.EarlyRedeliveries += t.EarlyRedeliveries
	if t.RedeliveryMinMS > 0 && (r.RedeliveryMinMS == 0 || t.RedeliveryMinMS < r.RedeliveryMinMS) {
		r.RedeliveryMinMS = t.RedeliveryMinMS
	}
	r.RedeliveryMaxMS = max(r.RedeliveryMaxMS, t.RedeliveryMaxMS)
}

// trialDB is a fresh database with the fencelock schema.
func trialDB(ctx context.Context, pg *testenv.Postgres) (string, *pgxpool.Pool, func(), error) {
	name, url, err := pg.CreateDatabase(ctx)
	if err != nil {
		return "", nil, nil, err
	}
	drop := func() { _ = pg.DropDatabase(context.WithoutCancel(ctx), name) }
	sdb, err := sql.Open("pgx", url)
	if err == nil {
		err = migrations.Up(ctx, sdb, migrations.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		_ = sdb.Close()
	}
	if err != nil {
		drop()
		return "", nil, nil, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		drop()
		return "", nil, nil, err
	}
	return url, pool, func() { pool.Close(); drop() }, nil
}

// trialLease is the writer's lease: one holder for the whole trial.
type trialLease struct{}

func (trialLease) Name() string   { return "chaos:outbox" }
func (trialLease) Token() int64   { return 1 }
func (trialLease) Holder() string { return "writer" }

// delivery is one request a receiver got.
type delivery struct {
	key string
	at  time.Time
}

func outboxTrial(ctx context.Context, pg *testenv.Postgres, cfg *OutboxConfig, rng *rand.Rand) (*OutboxReport, error) {
	url, pool, dropSender, err := trialDB(ctx, pg)
	if err != nil {
		return nil, err
	}
	defer dropSender()
	_, rpool, dropReceiver, err := trialDB(ctx, pg)
	if err != nil {
		return nil, err
	}
	defer dropReceiver()
	if _, err := rpool.Exec(ctx, `CREATE TABLE applied (key text NOT NULL)`); err != nil {
		return nil, err
	}

	// The receivers: both take a little time per request, so that kills
	// land in the middle of sends.
	var mu sync.Mutex
	var plain []delivery
	rstore, err := pgfence.New(rpool)
	if err != nil {
		return nil, err
	}
	fenced := outbox.Receive(rstore, func(ctx context.Context, tx pgx.Tx, d outbox.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1)`, d.Key)
		return err
	})
	mux := http.NewServeMux()
	mux.HandleFunc("/fenced", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(10 * time.Millisecond)
		fenced.ServeHTTP(w, r)
	})
	mux.HandleFunc("/plain", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
		plain = append(plain, delivery{key: r.Header.Get(outbox.HeaderIdempotencyKey), at: time.Now()})
		mu.Unlock()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	base := "http://" + ln.Addr().String()

	rcfg := outboxtest.RelayConfig{URL: url, Batch: cfg.Batch, Visibility: cfg.Visibility, SendTimeout: cfg.Visibility / 4, Poll: cfg.Poll}
	relays := [2]*outboxtest.Process{}
	for i := range relays {
		if relays[i], err = outboxtest.StartProcess(cfg.RelayCommand(), rcfg); err != nil {
			return nil, err
		}
	}
	defer func() {
		for _, r := range relays {
			r.Stop()
		}
	}()

	// The writer: one guarded transaction per effect, recording it for
	// both receivers, while the nemesis kills relays.
	store, err := pgfence.New(pool)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	werr := make(chan error, 1)
	go func() {
		for i := range cfg.Effects {
			key := fmt.Sprintf("e%d", i)
			_, err := guard.Exec(wctx, store, trialLease{}, func(ctx context.Context, tx pgx.Tx) error {
				return outbox.Add(ctx, tx,
					outbox.Effect{Destination: base + "/plain", Key: key},
					outbox.Effect{Destination: base + "/fenced", Key: key})
			})
			if err != nil {
				werr <- err
				return
			}
			// Spread over the kills: relays are busy when they die.
			time.Sleep(5 * time.Millisecond)
		}
		werr <- nil
	}()
	kills := 0
	for ; kills < cfg.Kills; kills++ {
		if err := pause(ctx, time.Duration(100+rng.IntN(500))*time.Millisecond); err != nil {
			return nil, err
		}
		v := rng.IntN(len(relays))
		relays[v].Kill()
		if err := pause(ctx, time.Duration(rng.IntN(300))*time.Millisecond); err != nil {
			return nil, err
		}
		if relays[v], err = outboxtest.StartProcess(cfg.RelayCommand(), rcfg); err != nil {
			return nil, err
		}
	}
	if err := <-werr; err != nil {
		return nil, fmt.Errorf("writer: %w", err)
	}
	deadline := time.Now().Add(2*time.Minute + time.Duration(cfg.Kills)*cfg.Visibility)
	for {
		c, err := outbox.Count(ctx, pool)
		if err != nil {
			return nil, err
		}
		if c.Due+c.Waiting+c.Claimed+c.Dead == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the outbox still holds %+v", c)
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}

	t := &OutboxReport{Trials: 1, Kills: kills, Effects: cfg.Effects, DuplicatesAllowed: kills * cfg.Batch}
	rows, err := rpool.Query(ctx, `SELECT key, count(*) FROM applied GROUP BY key`)
	if err != nil {
		return nil, err
	}
	applied := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			rows.Close()
			return nil, err
		}
		applied[k] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	first := map[string]time.Time{}
	for _, d := range plain {
		at, ok := first[d.key]
		if !ok {
			first[d.key] = d.at
			continue
		}
		t.Duplicates++
		gap := d.at.Sub(at)
		if gap < cfg.Visibility-rcfg.SendTimeout-100*time.Millisecond {
			t.EarlyRedeliveries++
		}
		if ms := gap.Milliseconds(); t.RedeliveryMinMS == 0 || ms < t.RedeliveryMinMS {
			t.RedeliveryMinMS = ms
		}
		t.RedeliveryMaxMS = max(t.RedeliveryMaxMS, gap.Milliseconds())
	}
	for i := range cfg.Effects {
		key := fmt.Sprintf("e%d", i)
		if _, ok := first[key]; !ok || applied[key] == 0 {
			t.Lost++
		}
		if applied[key] > 1 {
			t.AppliedTwice++
		}
	}
	return t, nil
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
