package fencelockotel_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/migrations"
	fencelockotel "github.com/fencelock/fencelock/otel"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/outbox/outboxtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// migratedDB is a fresh database with the fencelock schema.
func migratedDB(t *testing.T) *testenv.DB {
	t.Helper()
	db := testenv.NewDB(t)
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	defer sdb.Close()
	require.NoError(t, migrations.Up(context.Background(), sdb, migrations.WithLogger(outboxtest.Quiet)))
	return db
}

// record adds effects in one guarded transaction of lease.
func record(t *testing.T, pool *pgxpool.Pool, l guard.Lease, effects ...outbox.Effect) {
	t.Helper()
	store, err := pgfence.New(pool)
	require.NoError(t, err)
	_, err = guard.Exec(context.Background(), store, l, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.Add(ctx, tx, effects...)
	})
	require.NoError(t, err)
}

// sender is an HTTPSender whose idle connections end with the test.
func sender(t *testing.T) *outbox.HTTPSender {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &outbox.HTTPSender{Client: &http.Client{Transport: tr}}
}

// A relay reports every outcome of a delivery to the observer: counted by
// outcome, timed, and a span per Send. The effects go to a receiver that
// fences (outbox.Receive on its own Postgres): one delivered, its twin of
// the same key already applied there, one refused as superseded (409: the
// receiver has a newer token for its resource); and to one that does not:
// one retried after a 503 and then delivered, one dead after a 422. Only
// the retried and the dead attempts mark their span as an error: already
// applied and superseded are the fence at work, said by the outcome
// attribute.
func TestRelayMetricsAndSpans(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	rdb := migratedDB(t)
	_, err := rdb.Pool.Exec(ctx, `CREATE TABLE applied (key text)`)
	require.NoError(t, err)
	_, err = rdb.Pool.Exec(ctx, `SELECT fencelock.advance('old', 5, 'newer')`)
	require.NoError(t, err)
	rstore, err := pgfence.New(rdb.Pool)
	require.NoError(t, err)
	fenced := httptest.NewServer(outbox.Receive(rstore, func(ctx context.Context, tx pgx.Tx, d outbox.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1)`, d.Key)
		return err
	}))
	t.Cleanup(fenced.Close)
	var mu sync.Mutex
	seen := map[string]int{}
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(outbox.HeaderIdempotencyKey)
		mu.Lock()
		seen[key]++
		n := seen[key]
		mu.Unlock()
		switch {
		case key == "flaky" && n == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case key == "bad":
			w.WriteHeader(http.StatusUnprocessableEntity)
		}
	}))
	t.Cleanup(plain.Close)

	record(t, e.pool, lateWriter{name: "r", holder: "h", token: 1},
		outbox.Effect{Destination: fenced.URL, Key: "ok"}, outbox.Effect{Destination: fenced.URL, Key: "ok"},
		outbox.Effect{Destination: plain.URL, Key: "flaky"}, outbox.Effect{Destination: plain.URL, Key: "bad"})
	record(t, e.pool, lateWriter{name: "old", holder: "h", token: 1}, outbox.Effect{Destination: fenced.URL, Key: "stale"})

	// One send at a time: the twins reach the receiver one after the other.
	outboxtest.StartRelay(t, e.pool, sender(t), outbox.WithObserver(e.obs), outbox.WithBatchSize(1), outbox.WithConcurrency(1),
		outbox.WithPollInterval(10*time.Millisecond), outbox.WithBackoff(10*time.Millisecond, 10*time.Millisecond))
	op := fencelockotel.KeyOp.String
	// The relay reports a record after the database has it: wait for the
	// six attempts' records to be reported, not only for the rows to be
	// gone (the last report could come after that, and be missed).
	recorded := func(rm metricdata.ResourceMetrics) int64 {
		return count(t, rm, "fencelock.outbox.recorded", op("ack"), outcome("changed")) +
			count(t, rm, "fencelock.outbox.recorded", op("retry"), outcome("changed"))
	}
	require.Eventually(t, func() bool {
		c, err := outbox.Count(ctx, e.pool)
		require.NoError(t, err)
		if c != (outbox.Counts{Dead: 1}) {
			return false
		}
		rm := e.collect(t)
		return has(rm, "fencelock.outbox.recorded") && recorded(rm) >= 6
	}, time.Minute, 10*time.Millisecond, "all delivered but the dead one, and the six attempts recorded")

	rm := e.collect(t)
	for o, want := range map[string]int64{"delivered": 2, "already_applied": 1, "superseded": 1, "retried": 1, "dead": 1} {
		assert.Equal(t, want, count(t, rm, "fencelock.outbox.deliveries", outcome(o)), o)
	}
	n, sum := hist(t, rm, "fencelock.outbox.send.duration")
	assert.EqualValues(t, 6, n)
	assert.Positive(t, sum)
	n, sum = hist(t, rm, "fencelock.outbox.delivery.lag", outcome("delivered"))
	assert.EqualValues(t, 2, n)
	assert.Positive(t, sum)
	assert.EqualValues(t, 6, count(t, rm, "fencelock.outbox.claimed"), "a claimed row per attempt")
	n, _ = hist(t, rm, "fencelock.outbox.claim.duration")
	assert.Positive(t, n)
	assert.EqualValues(t, 4, count(t, rm, "fencelock.outbox.recorded", op("ack"), outcome("changed")), "delivered ×2, already applied, superseded")
	assert.EqualValues(t, 2, count(t, rm, "fencelock.outbox.recorded", op("retry"), outcome("changed")), "retried, dead")
	assert.Zero(t, count(t, rm, "fencelock.outbox.recorded", outcome("claim_lost")))
	assert.False(t, has(rm, "fencelock.outbox.errors"), "no database error")
	assert.False(t, allAttrs(rm)[fencelockotel.KeyResource], "no resource on metrics by default")

	var sends []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == "outbox.Send" {
			sends = append(sends, s)
		}
	}
	require.Len(t, sends, 6)
	status := map[string]codes.Code{}
	for _, s := range sends {
		set := attribute.NewSet(s.Attributes()...)
		o, _ := set.Value(fencelockotel.KeyOutcome)
		status[o.AsString()] = s.Status().Code
		assert.Equal(t, trace.SpanKindProducer, s.SpanKind())
		assert.True(t, s.EndTime().After(s.StartTime()))
		for _, k := range []attribute.Key{fencelockotel.KeyResource, fencelockotel.KeyToken, fencelockotel.KeyHolder,
			fencelockotel.KeyKey, fencelockotel.KeyDestination, fencelockotel.KeyAttempt} {
			_, ok := set.Value(k)
			assert.True(t, ok, "%s on %v", k, s.Attributes())
		}
		switch o.AsString() {
		case "superseded":
			assert.True(t, matches(set, []attribute.KeyValue{fencelockotel.KeyResource.String("old"), fencelockotel.KeyKey.String("stale"),
				fencelockotel.KeyDestination.String(fenced.URL)}), "%v", s.Attributes())
		case "dead":
			assert.Contains(t, s.Status().Description, "422 Unprocessable Entity")
		case "retried":
			assert.True(t, matches(set, []attribute.KeyValue{fencelockotel.KeyAttempt.Int(1), fencelockotel.KeyKey.String("flaky")}), "%v", s.Attributes())
		}
	}
	assert.Equal(t, map[string]codes.Code{"delivered": codes.Unset, "already_applied": codes.Unset, "superseded": codes.Unset,
		"retried": codes.Error, "dead": codes.Error}, status)
}

// Database trouble that a relay waits through is counted by op.
func TestRelayErrorsCounted(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	outboxtest.StartRelay(t, e.pool, sender(t), outbox.WithObserver(e.obs), outbox.WithPollInterval(time.Millisecond))
	require.Eventually(t, func() bool { return has(e.collect(t), "fencelock.outbox.claim.duration") }, time.Minute, 10*time.Millisecond, "a claim")
	_, err := e.pool.Exec(ctx, `ALTER FUNCTION fencelock.outbox_claim(bigint, integer, interval, text) RENAME TO outbox_claim_gone`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rm := e.collect(t)
		return has(rm, "fencelock.outbox.errors") && count(t, rm, "fencelock.outbox.errors", fencelockotel.KeyOp.String("claim")) >= 2
	}, time.Minute, 10*time.Millisecond, "failed claims counted")
	_, err = e.pool.Exec(ctx, `ALTER FUNCTION fencelock.outbox_claim_gone(bigint, integer, interval, text) RENAME TO outbox_claim`)
	require.NoError(t, err)
}

// backlogPoints reads the backlog gauge by state; ok is false when it has
// no value.
func backlogPoints(t *testing.T, reader *sdkmetric.ManualReader) (map[string]int64, bool) {
	t.Helper()
	rows, _, ok := backlogReading(t, reader)
	return rows, ok
}

// backlogReading reads the backlog gauge and the capped gauge by state;
// ok is false when they have no value.
func backlogReading(t *testing.T, reader *sdkmetric.ManualReader) (rows, capped map[string]int64, ok bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	points := func(name string) map[string]int64 {
		if !has(rm, name) {
			return nil
		}
		g, ok := find(t, rm, name).Data.(metricdata.Gauge[int64])
		require.True(t, ok, "%s: an int64 gauge", name)
		if len(g.DataPoints) == 0 {
			return nil
		}
		out := map[string]int64{}
		for _, p := range g.DataPoints {
			s, _ := p.Attributes.Value(fencelockotel.KeyState)
			out[s.AsString()] = p.Value
		}
		return out
	}
	rows, capped = points("fencelock.outbox.backlog"), points("fencelock.outbox.backlog.capped")
	require.Equal(t, rows == nil, capped == nil, "both gauges have a value, or neither")
	return rows, capped, rows != nil
}

// clock is a clock the test moves.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// The backlog gauge counts the outbox's rows by state (exactly, on a small
// table: the capped gauge says 0 for each state), and reads the
// database at most once per interval, however often it is collected: a
// collection within the interval reports the last reading, even when rows
// were added since, up to its last nanosecond; one at its end reads again.
// A reading that fails reports no value and counts an error, once per
// interval too. The interval is read on a clock the test moves.
func TestOutboxBacklog(t *testing.T) {
	db := migratedDB(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	clk := &clock{t: time.Now()}
	_, err := fencelockotel.New(fencelockotel.WithMeterProvider(mp), fencelockotel.WithOutboxBacklog(db.Pool, 2*time.Second),
		fencelockotel.WithClock(clk.Now))
	require.NoError(t, err)

	l := lateWriter{name: "r", holder: "h", token: 1}
	record(t, db.Pool, l, outbox.Effect{Destination: "d", Key: "due"}, outbox.Effect{Destination: "d", Key: "claimed"},
		outbox.Effect{Destination: "d", Key: "waiting"}, outbox.Effect{Destination: "d", Key: "dead"})
	for _, q := range []string{
		`UPDATE fencelock.outbox SET claim = 1, due_at = now() + interval '1 hour' WHERE key = 'claimed'`,
		`UPDATE fencelock.outbox SET due_at = now() + interval '1 hour' WHERE key = 'waiting'`,
		`UPDATE fencelock.outbox SET dead_at = now() WHERE key = 'dead'`,
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	want := map[string]int64{"due": 1, "claimed": 1, "waiting": 1, "dead": 1}
	got, capped, ok := backlogReading(t, reader)
	require.True(t, ok)
	assert.Equal(t, want, got)
	assert.Equal(t, map[string]int64{"due": 0, "claimed": 0, "waiting": 0, "dead": 0}, capped, "every count exact")

	record(t, db.Pool, l, outbox.Effect{Destination: "d", Key: "new-1"}, outbox.Effect{Destination: "d", Key: "new-2"})
	for _, at := range []time.Duration{0, time.Second, time.Second - time.Nanosecond} {
		clk.Add(at)
		for range 5 {
			got, ok := backlogPoints(t, reader)
			require.True(t, ok)
			assert.Equal(t, want, got, "within the interval: the last reading")
		}
	}
	clk.Add(time.Nanosecond) // 2 s after the first reading
	want["due"] = 3
	got, _ = backlogPoints(t, reader)
	assert.Equal(t, want, got, "at the interval's end: a new reading")
	record(t, db.Pool, l, outbox.Effect{Destination: "d", Key: "new-3"})
	got, _ = backlogPoints(t, reader)
	assert.Equal(t, want, got, "and then the last reading again")

	// A database that fails.
	broken, err := pgxpool.New(ctx, db.URL)
	require.NoError(t, err)
	broken.Close()
	reader2 := sdkmetric.NewManualReader()
	mp2 := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader2))
	t.Cleanup(func() { _ = mp2.Shutdown(context.Background()) })
	_, err = fencelockotel.New(fencelockotel.WithMeterProvider(mp2), fencelockotel.WithOutboxBacklog(broken, time.Hour))
	require.NoError(t, err)
	for range 3 {
		_, ok := backlogPoints(t, reader2)
		assert.False(t, ok, "no value from a reading that failed")
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader2.Collect(ctx, &rm))
	assert.EqualValues(t, 1, count(t, rm, "fencelock.outbox.errors", fencelockotel.KeyOp.String("backlog")), "one reading per interval, failed or not")

	for _, o := range []fencelockotel.Option{
		fencelockotel.WithOutboxBacklog(nil, 0), fencelockotel.WithOutboxBacklog(db.Pool, time.Millisecond),
	} {
		_, err := fencelockotel.New(o)
		require.ErrorIs(t, err, fencelockotel.ErrInvalidOption)
	}
}

// On a backlog larger than the limit the gauge counts up to, the count of
// due rows saturates at the limit and the capped gauge says so; the
// states whose rows are fewer are exact.
func TestOutboxBacklogCapped(t *testing.T) {
	db := migratedDB(t)
	const rows = 2 * outbox.DefaultBacklogLimit
	outboxtest.LoadBacklog(t, db.Pool, rows)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	_, err := fencelockotel.New(fencelockotel.WithMeterProvider(mp), fencelockotel.WithOutboxBacklog(db.Pool, 0))
	require.NoError(t, err)

	got, capped, ok := backlogReading(t, reader)
	require.True(t, ok)
	assert.Equal(t, map[string]int64{"due": outbox.DefaultBacklogLimit, "waiting": 0, "claimed": 0, "dead": rows / 1000}, got)
	assert.Equal(t, map[string]int64{"due": 1, "waiting": 0, "claimed": 0, "dead": 0}, capped)
}
