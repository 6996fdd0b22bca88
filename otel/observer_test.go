package fencelockotel_test

import (
	"context"
	"syscall"
	"testing"
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
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// env is a real Redis, a real Postgres database with the fencelock
// schema, and an Observer on the real OTel SDK with an in-memory reader
// and span recorder.
type env struct {
	ctx    context.Context
	rdb    *redis.Client
	pool   *pgxpool.Pool
	obs    *fencelockotel.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newEnv(t *testing.T, opts ...fencelockotel.Option) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	srv := testenv.NewRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	db := testenv.NewDB(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.NoError(t, sqlDB.Close())
	_, err := db.Pool.Exec(ctx, "CREATE TABLE stock (sku text, qty int)")
	require.NoError(t, err)

	e := &env{ctx: ctx, rdb: rdb, pool: db.Pool, reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = e.tp.Shutdown(context.Background()) })
	e.obs, err = fencelockotel.New(append([]fencelockotel.Option{
		fencelockotel.WithMeterProvider(mp), fencelockotel.WithTracerProvider(e.tp)}, opts...)...)
	require.NoError(t, err)
	return e
}

func (e *env) client(t *testing.T, opts ...fence.ClientOption) *fence.Client {
	t.Helper()
	c, err := fence.New(e.rdb, append([]fence.ClientOption{fence.WithObserver(e.obs)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func (e *env) store(t *testing.T) *pgfence.Store {
	t.Helper()
	s, err := pgfence.New(e.pool, pgstore.WithObserver(e.obs))
	require.NoError(t, err)
	return s
}

func (e *env) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, e.reader.Collect(context.Background(), &rm))
	return rm
}

// find returns the metric called name, failing the test if it is absent.
func find(t *testing.T, rm metricdata.ResourceMetrics, name string) metricdata.Metrics {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				assert.Equal(t, fencelockotel.ScopeName, sm.Scope.Name)
				return m
			}
		}
	}
	require.Failf(t, "metric missing", "no metric %q", name)
	return metricdata.Metrics{}
}

func matches(set attribute.Set, kv []attribute.KeyValue) bool {
	for _, want := range kv {
		got, ok := set.Value(want.Key)
		if !ok || got != want.Value {
			return false
		}
	}
	return true
}

// has reports whether the metric called name was recorded at all (the SDK
// exports an instrument only after its first measurement).
func has(rm metricdata.ResourceMetrics, name string) bool {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return true
			}
		}
	}
	return false
}

// count sums a counter's points whose attributes include kv.
func count(t *testing.T, rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) int64 {
	t.Helper()
	sum, ok := find(t, rm, name).Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is an int64 sum", name)
	var n int64
	for _, p := range sum.DataPoints {
		if matches(p.Attributes, kv) {
			n += p.Value
		}
	}
	return n
}

// hist sums a histogram's counts and sums over points whose attributes
// include kv.
func hist(t *testing.T, rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) (n uint64, sum float64) {
	t.Helper()
	h, ok := find(t, rm, name).Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is a float64 histogram", name)
	for _, p := range h.DataPoints {
		if matches(p.Attributes, kv) {
			n += p.Count
			sum += p.Sum
		}
	}
	return n, sum
}

// allAttrs lists every attribute key on every point of every metric.
func allAttrs(rm metricdata.ResourceMetrics) map[attribute.Key]bool {
	keys := map[attribute.Key]bool{}
	add := func(s attribute.Set) {
		for _, kv := range s.ToSlice() {
			keys[kv.Key] = true
		}
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					add(p.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					add(p.Attributes)
				}
			}
		}
	}
	return keys
}

func insert(sku string) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO stock VALUES ($1, 1)", sku)
		return err
	}
}

var (
	outcome = fencelockotel.KeyOutcome.String
	reason  = fencelockotel.KeyReason.String
	end     = fencelockotel.KeyEnd.String
)

// The scripted late writer: worker A takes the lock and writes batch 1;
// its lock key vanishes while it is paused (deleted here, as expiry or a
// Redis failover would); worker B takes the lock, repeats batch 1 (already
// applied) and writes batch 2; A wakes up and writes batch 2 with its old
// token (stale); A's next renewal finds the lock taken. Every step is a
// metric and a span.
func TestLateWriterMetricsAndSpans(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	locks := e.client(t)
	store := e.store(t)

	// A renews by hand (a fixed lease), so its Refresh below is the
	// renewal that finds the lock taken.
	a, err := locks.Acquire(ctx, "stock", fence.WithFixedLease(30*time.Second))
	require.NoError(t, err)
	_, err = locks.TryAcquire(ctx, "stock") // B, too early
	require.ErrorIs(t, err, fence.ErrNotAcquired)

	parentCtx, parent := e.tp.Tracer("test").Start(ctx, "batch")
	_, err = guard.Exec(parentCtx, store, a, insert("b1"), guard.WithKey("batch-1"))
	parent.End()
	require.NoError(t, err)

	// A pauses; its key goes.
	paused := lateWriter{name: a.Name(), holder: a.Holder(), token: a.Token()}
	require.NoError(t, e.rdb.Del(ctx, fence.DefaultPrefix+"{stock}").Err())

	b, err := locks.Acquire(ctx, "stock", fence.WithLease(300*time.Millisecond))
	require.NoError(t, err)
	require.Greater(t, b.Token(), a.Token())
	_, err = guard.Exec(ctx, store, b, insert("b1"), guard.WithKey("batch-1"))
	require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	_, err = guard.Exec(ctx, store, b, insert("b2"), guard.WithKey("batch-2"))
	require.NoError(t, err)

	// A wakes up and writes: the database refuses.
	_, err = guard.Exec(ctx, store, paused, insert("late"), guard.WithKey("batch-2-late"))
	require.ErrorIs(t, err, guard.ErrStaleToken)
	// A's next renewal finds the lock taken.
	require.ErrorIs(t, a.Refresh(ctx, 30*time.Second), fence.ErrLockLost)

	// B's watchdog renews (every lease/3) before B releases.
	require.Eventually(t, func() bool {
		rm := e.collect(t)
		return has(rm, "fencelock.lock.renewals") && count(t, rm, "fencelock.lock.renewals", outcome("ok")) >= 1
	}, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, b.Release(ctx))

	rm := e.collect(t)
	assert.EqualValues(t, 2, count(t, rm, "fencelock.lock.acquisitions", outcome("acquired")))
	assert.EqualValues(t, 1, count(t, rm, "fencelock.lock.acquisitions", outcome("not_acquired")))
	n, _ := hist(t, rm, "fencelock.lock.wait.duration")
	assert.EqualValues(t, 3, n, "a wait time per acquisition")
	assert.EqualValues(t, 1, count(t, rm, "fencelock.lock.losses", reason("taken")))
	n, _ = hist(t, rm, "fencelock.lock.hold.duration", end("lost"))
	assert.EqualValues(t, 1, n)
	n, sum := hist(t, rm, "fencelock.lock.hold.duration", end("released"))
	assert.EqualValues(t, 1, n)
	assert.Greater(t, sum, 0.1, "B held its lock through a renewal (lease/3 = 100 ms)")
	assert.Zero(t, count(t, rm, "fencelock.lock.renewals", outcome("error")))

	assert.EqualValues(t, 2, count(t, rm, "fencelock.guard.execs", outcome("committed"), reason("none")))
	assert.EqualValues(t, 1, count(t, rm, "fencelock.guard.execs", outcome("rejected"), reason("already_applied")))
	assert.EqualValues(t, 1, count(t, rm, "fencelock.guard.execs", outcome("rejected"), reason("stale_token")))
	assert.Zero(t, count(t, rm, "fencelock.guard.execs", outcome("unknown")))
	n, sum = hist(t, rm, "fencelock.guard.exec.duration")
	assert.EqualValues(t, 4, n)
	assert.Positive(t, sum)

	keys := allAttrs(rm)
	assert.False(t, keys[fencelockotel.KeyLockName] || keys[fencelockotel.KeyResource],
		"no names on metrics by default: %v", keys)

	// Spans: one per acquisition call and per Exec, with the outcome.
	var execs, acquires []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		switch s.Name() {
		case "guard.Exec":
			execs = append(execs, s)
		case "fence.Acquire":
			acquires = append(acquires, s)
		}
	}
	require.Len(t, execs, 4)
	require.Len(t, acquires, 3)
	attrs := func(s sdktrace.ReadOnlySpan) attribute.Set { return attribute.NewSet(s.Attributes()...) }
	first := execs[0]
	assert.Equal(t, parent.SpanContext().SpanID(), first.Parent().SpanID(), "guard.Exec is a child of the caller's span")
	assert.Equal(t, parent.SpanContext().TraceID(), first.SpanContext().TraceID())
	assert.True(t, matches(attrs(first), []attribute.KeyValue{outcome("committed"),
		fencelockotel.KeyResource.String("stock"), fencelockotel.KeyToken.Int64(a.Token()),
		fencelockotel.KeyKey.String("batch-1")}), "%v", first.Attributes())
	assert.False(t, first.StartTime().After(first.EndTime()))
	assert.True(t, first.EndTime().Sub(first.StartTime()) > 0)
	skipped := execs[1]
	assert.True(t, matches(attrs(skipped), []attribute.KeyValue{outcome("rejected"), reason("already_applied"),
		fencelockotel.KeyKey.String("batch-1")}), "%v", skipped.Attributes())
	assert.Equal(t, codes.Unset, skipped.Status().Code, "a key already applied is a retry skipped, not an error")
	late := execs[3]
	assert.True(t, matches(attrs(late), []attribute.KeyValue{outcome("rejected"), reason("stale_token"),
		fencelockotel.KeyToken.Int64(a.Token())}), "%v", late.Attributes())
	assert.Equal(t, "Error", late.Status().Code.String())
	assert.Contains(t, late.Status().Description, "stale fencing token")
	assert.True(t, matches(attrs(acquires[1]), []attribute.KeyValue{outcome("not_acquired"),
		fencelockotel.KeyLockName.String("stock")}), "%v", acquires[1].Attributes())
	assert.Equal(t, trace.SpanKindClient, acquires[0].SpanKind())
}

// WithNameAttribute puts the lock and resource names on the metrics.
func TestNameAttribute(t *testing.T) {
	e := newEnv(t, fencelockotel.WithNameAttribute())
	locks := e.client(t)
	l, err := locks.Acquire(e.ctx, "eu")
	require.NoError(t, err)
	_, err = guard.Exec(e.ctx, e.store(t), l, insert("x"))
	require.NoError(t, err)
	require.NoError(t, l.Release(e.ctx))
	rm := e.collect(t)
	assert.EqualValues(t, 1, count(t, rm, "fencelock.lock.acquisitions", fencelockotel.KeyLockName.String("eu")))
	assert.EqualValues(t, 1, count(t, rm, "fencelock.guard.execs", fencelockotel.KeyResource.String("eu"), outcome("committed")))
	n, _ := hist(t, rm, "fencelock.lock.hold.duration", fencelockotel.KeyLockName.String("eu"), end("released"))
	assert.EqualValues(t, 1, n)
}

// A lock that reaches its max hold is a loss with reason max_hold.
func TestMaxHoldLoss(t *testing.T) {
	e := newEnv(t)
	locks := e.client(t)
	l, err := locks.Acquire(e.ctx, "short", fence.WithMaxHold(fence.MinLease)) // the shortest max hold accepted
	require.NoError(t, err)
	<-l.Done()
	require.Eventually(t, func() bool {
		rm := e.collect(t)
		return has(rm, "fencelock.lock.losses") && count(t, rm, "fencelock.lock.losses", reason("max_hold")) == 1
	}, 10*time.Second, 10*time.Millisecond)
	n, _ := hist(t, e.collect(t), "fencelock.lock.hold.duration", end("max_hold"))
	assert.EqualValues(t, 1, n)
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []fencelockotel.Option{nil, fencelockotel.WithMeterProvider(nil), fencelockotel.WithTracerProvider(nil)} {
		_, err := fencelockotel.New(o)
		require.ErrorIs(t, err, fencelockotel.ErrInvalidOption)
		assert.NotContains(t, err.Error(), "\n")
	}
	// The global providers by default.
	o, err := fencelockotel.New()
	require.NoError(t, err)
	require.NotNil(t, o)
}

// spansNamed returns the ended spans called name, in the order they ended.
func (e *env) spansNamed(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func spanAttrs(s sdktrace.ReadOnlySpan) attribute.Set { return attribute.NewSet(s.Attributes()...) }

// Every release is a span under the caller's: released (with how long the
// lock was held), not_held for a lock lost before (no error status: the
// loss is counted apart), and the releases of Close.
func TestReleaseSpans(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	locks := e.client(t)

	parentCtx, parent := e.tp.Tracer("test").Start(ctx, "job")
	l, err := locks.Acquire(parentCtx, "rel")
	require.NoError(t, err)
	require.NoError(t, l.Release(parentCtx))
	parent.End()

	lost, err := locks.Acquire(ctx, "rel-lost", fence.WithFixedLease(30*time.Second))
	require.NoError(t, err)
	require.NoError(t, e.rdb.Del(ctx, fence.DefaultPrefix+"{rel-lost}").Err())
	require.ErrorIs(t, lost.Refresh(ctx, 30*time.Second), fence.ErrLockLost)
	require.ErrorIs(t, lost.Release(ctx), fence.ErrNotHeld)

	_, err = locks.Acquire(ctx, "rel-close")
	require.NoError(t, err)
	require.NoError(t, locks.Close(ctx))

	spans := e.spansNamed("fence.Release")
	require.Len(t, spans, 3)
	first := spans[0]
	assert.Equal(t, parent.SpanContext().SpanID(), first.Parent().SpanID(), "fence.Release is a child of the caller's span")
	assert.True(t, matches(spanAttrs(first), []attribute.KeyValue{fencelockotel.KeyLockName.String("rel"),
		fencelockotel.KeyToken.Int64(l.Token()), outcome("released")}), "%v", first.Attributes())
	firstAttrs := spanAttrs(first)
	held, ok := firstAttrs.Value(fencelockotel.KeyHeld)
	require.True(t, ok)
	assert.Positive(t, held.AsFloat64())
	assert.True(t, first.EndTime().After(first.StartTime()), "the span covers the release's round trip")
	assert.Equal(t, codes.Unset, first.Status().Code)
	assert.Equal(t, trace.SpanKindClient, first.SpanKind())

	assert.True(t, matches(spanAttrs(spans[1]), []attribute.KeyValue{fencelockotel.KeyLockName.String("rel-lost"), outcome("not_held")}), "%v", spans[1].Attributes())
	assert.Equal(t, codes.Unset, spans[1].Status().Code, "the loss is the event; releasing a lost lock is not an error on the span")
	assert.True(t, matches(spanAttrs(spans[2]), []attribute.KeyValue{fencelockotel.KeyLockName.String("rel-close"), outcome("released")}), "%v", spans[2].Attributes())
}

// A step of a finished run is skipped like an applied key: not a span
// error; a stale token is.
func TestFinishedRunIsNotASpanError(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	store := e.store(t)
	l, err := e.client(t).Acquire(ctx, "runs")
	require.NoError(t, err)
	defer l.Release(ctx)
	run := store.Run(l, "snapshot-1")
	require.NoError(t, run.Finish(ctx))
	require.ErrorIs(t, run.Step(ctx, "c1", insert("late")), guard.ErrRunFinished)

	execs := e.spansNamed("guard.Exec")
	require.Len(t, execs, 2)
	assert.True(t, matches(spanAttrs(execs[1]), []attribute.KeyValue{outcome("rejected"), reason("run_finished")}), "%v", execs[1].Attributes())
	assert.Equal(t, codes.Unset, execs[1].Status().Code)
}

// Store.Advance is a span and a count: committed when the claim is
// recorded, rejected stale_token (an Error) for an older token.
func TestAdvanceSpans(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	store := e.store(t)
	locks := e.client(t)
	old, err := locks.Acquire(ctx, "adv", fence.WithFixedLease(30*time.Second))
	require.NoError(t, err)
	paused := lateWriter{name: old.Name(), holder: old.Holder(), token: old.Token()}
	require.NoError(t, e.rdb.Del(ctx, fence.DefaultPrefix+"{adv}").Err())
	l, err := locks.Acquire(ctx, "adv")
	require.NoError(t, err)
	defer l.Release(ctx)

	parentCtx, parent := e.tp.Tracer("test").Start(ctx, "takeover")
	require.NoError(t, store.Advance(parentCtx, l))
	parent.End()
	require.ErrorIs(t, store.Advance(ctx, paused), guard.ErrStaleToken)

	spans := e.spansNamed("guard.Advance")
	require.Len(t, spans, 2)
	assert.Equal(t, parent.SpanContext().SpanID(), spans[0].Parent().SpanID(), "guard.Advance is a child of the caller's span")
	assert.True(t, matches(spanAttrs(spans[0]), []attribute.KeyValue{outcome("committed"), reason("none"),
		fencelockotel.KeyResource.String("adv"), fencelockotel.KeyToken.Int64(l.Token())}), "%v", spans[0].Attributes())
	assert.Equal(t, codes.Unset, spans[0].Status().Code)
	assert.True(t, matches(spanAttrs(spans[1]), []attribute.KeyValue{outcome("rejected"), reason("stale_token"),
		fencelockotel.KeyToken.Int64(old.Token())}), "%v", spans[1].Attributes())
	assert.Equal(t, codes.Error, spans[1].Status().Code)
	assert.Contains(t, spans[1].Status().Description, "stale fencing token")

	rm := e.collect(t)
	assert.EqualValues(t, 1, count(t, rm, "fencelock.guard.advances", outcome("committed")))
	assert.EqualValues(t, 1, count(t, rm, "fencelock.guard.advances", outcome("rejected"), reason("stale_token")))
	assert.Empty(t, e.spansNamed("guard.Exec"), "Advance is not an Exec")
}

// A release that Redis does not answer ends its span with outcome error
// and an Error status carrying the release's error.
func TestReleaseErrorSpan(t *testing.T) {
	e := newEnv(t)
	srv := testenv.NewRedisServer(t) // its own server: this test stops it
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	locks, err := fence.New(rdb, fence.WithObserver(e.obs))
	require.NoError(t, err)
	t.Cleanup(func() { _ = locks.Close(context.Background()) })
	l, err := locks.Acquire(e.ctx, "rel-stalled")
	require.NoError(t, err)

	require.NoError(t, srv.Pause()) // SIGSTOP: the release's round trip gets no answer
	relErr := l.Release(e.ctx)
	require.NoError(t, srv.Resume())
	require.Error(t, relErr)
	require.NotErrorIs(t, relErr, fence.ErrNotHeld, "Redis did not answer; nothing says the lock was lost")

	spans := e.spansNamed("fence.Release")
	require.Len(t, spans, 1)
	assert.True(t, matches(spanAttrs(spans[0]), []attribute.KeyValue{fencelockotel.KeyLockName.String("rel-stalled"),
		fencelockotel.KeyToken.Int64(l.Token()), outcome("error")}), "%v", spans[0].Attributes())
	assert.Equal(t, codes.Error, spans[0].Status().Code)
	assert.Equal(t, relErr.Error(), spans[0].Status().Description)
	if rm := e.collect(t); has(rm, "fencelock.lock.hold.duration") {
		n, _ := hist(t, rm, "fencelock.lock.hold.duration", fencelockotel.KeyEnd.String("released"))
		assert.Zero(t, n, "a release that failed ended no hold")
	}
}

// An acquisition whose wait ended while Redis was down is an outage, not
// contention: outcome error, an Error status, and the dial error in it.
func TestAcquireOutageIsAnError(t *testing.T) {
	e := newEnv(t)
	srv := testenv.NewRedisServer(t) // its own server: this test kills it
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	locks, err := fence.New(rdb, fence.WithObserver(e.obs))
	require.NoError(t, err)
	t.Cleanup(func() { _ = locks.Close(context.Background()) })
	held, err := locks.Acquire(e.ctx, "contended")
	require.NoError(t, err)

	// Contention first: the lock is held, the wait ends.
	_, err = locks.Acquire(e.ctx, "contended", fence.WithWaitLimit(200*time.Millisecond))
	require.ErrorIs(t, err, fence.ErrNotAcquired)
	require.ErrorIs(t, held.Release(e.ctx), nil)

	require.NoError(t, srv.Kill()) // connections refused from now on
	_, err = locks.Acquire(e.ctx, "down", fence.WithWaitLimit(time.Second))
	require.ErrorIs(t, err, fence.ErrNotAcquired)
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "the wait's error carries the outage")

	spans := e.spansNamed("fence.Acquire")
	require.Len(t, spans, 3)
	assert.True(t, matches(spanAttrs(spans[1]), []attribute.KeyValue{outcome("not_acquired")}), "%v", spans[1].Attributes())
	assert.Equal(t, codes.Unset, spans[1].Status().Code, "a held lock is contention, not an error")
	assert.True(t, matches(spanAttrs(spans[2]), []attribute.KeyValue{fencelockotel.KeyLockName.String("down"), outcome("error")}), "%v", spans[2].Attributes())
	assert.Equal(t, codes.Error, spans[2].Status().Code)
	assert.Contains(t, spans[2].Status().Description, "connection refused")
	rm := e.collect(t)
	assert.EqualValues(t, 1, count(t, rm, "fencelock.lock.acquisitions", outcome("not_acquired")))
	assert.EqualValues(t, 1, count(t, rm, "fencelock.lock.acquisitions", outcome("error")))
}
