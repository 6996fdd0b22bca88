package fencelockotel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/fencelock/fencelock/otel"

// Attribute keys, on metrics (the low-cardinality ones, names only with
// WithNameAttribute) and spans.
const (
	KeyOutcome  = attribute.Key("fencelock.outcome")
	KeyReason   = attribute.Key("fencelock.reason")
	KeyEnd      = attribute.Key("fencelock.end")
	KeyLockName = attribute.Key("fencelock.lock.name")
	KeyResource = attribute.Key("fencelock.resource")
	KeyToken    = attribute.Key("fencelock.token")
	KeyHolder   = attribute.Key("fencelock.holder")
	KeyKey      = attribute.Key("fencelock.key")
	KeyWaited   = attribute.Key("fencelock.lock.waited_seconds")
	KeyHeld     = attribute.Key("fencelock.lock.held_seconds")
)

// Observer turns fence's lock events, guard's write events and the outbox
// relay's events into metrics and spans. It implements
// fence.AcquireObserver, fence.RenewObserver, fence.LossObserver,
// fence.ReleaseObserver, guard.ExecObserver, guard.AdvanceObserver and
// outbox's ClaimObserver, DeliveryObserver, RecordObserver and
// ErrorObserver, and tick.RunObserver and tick.MissObserver; one Observer can serve many clients, stores and relays.
// It is safe for concurrent use.
type Observer struct {
	tracer trace.Tracer
	names  bool
	sets   sync.Map // setKey → metric.MeasurementOption

	acquisitions metric.Int64Counter
	wait         metric.Float64Histogram
	hold         metric.Float64Histogram
	renewals     metric.Int64Counter
	losses       metric.Int64Counter
	execs        metric.Int64Counter
	execDur      metric.Float64Histogram
	advances     metric.Int64Counter
	relay        relayInstruments
	tick         tickInstruments
}

var (
	_ fence.AcquireObserver = (*Observer)(nil)
	_ fence.RenewObserver   = (*Observer)(nil)
	_ fence.LossObserver    = (*Observer)(nil)
	_ fence.ReleaseObserver = (*Observer)(nil)
	_ guard.ExecObserver    = (*Observer)(nil)
	_ guard.AdvanceObserver = (*Observer)(nil)
)

// Bucket boundaries in seconds. A round trip to Redis or Postgres is a
// millisecond or less; a wait or a batch can last minutes; a hold, hours.
var (
	latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}
	holdBuckets    = []float64{0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 4 * 3600}
)

// New returns an Observer whose instruments are made on the meter
// provider (default: the global one) and whose spans go to the tracer
// provider (default: the global one).
func New(opts ...Option) (*Observer, error) {
	var cfg config
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	m := cfg.mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version))
	o := &Observer{tracer: cfg.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(Version)), names: cfg.names}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	o.acquisitions, err = m.Int64Counter("fencelock.lock.acquisitions", metric.WithUnit("{acquisition}"),
		metric.WithDescription("Lock acquisition calls (TryAcquire, Acquire, Do) by outcome."))
	add(err)
	o.wait, err = m.Float64Histogram("fencelock.lock.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time an acquisition spent waiting for another holder (0 when the first attempt decided)."),
		metric.WithExplicitBucketBoundaries(append([]float64{0}, latencyBuckets...)...))
	add(err)
	o.hold, err = m.Float64Histogram("fencelock.lock.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("How long a lock was held, by how it ended."),
		metric.WithExplicitBucketBoundaries(holdBuckets...))
	add(err)
	o.renewals, err = m.Int64Counter("fencelock.lock.renewals", metric.WithUnit("{renewal}"),
		metric.WithDescription("Watchdog renewals by outcome (error: transient, retried until the deadline)."))
	add(err)
	o.losses, err = m.Int64Counter("fencelock.lock.losses", metric.WithUnit("{loss}"),
		metric.WithDescription("Locks lost (or ended by their max hold) by reason."))
	add(err)
	o.execs, err = m.Int64Counter("fencelock.guard.execs", metric.WithUnit("{exec}"),
		metric.WithDescription("Guarded writes (guard.Exec, run steps) by outcome and reason: committed; rejected (stale_token, already_applied, run_finished, lease_lost, read_only); failed; unknown (commit_in_flight, tx_ended)."))
	add(err)
	o.execDur, err = m.Float64Histogram("fencelock.guard.exec.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of a guarded write (begin, fn, commit), by outcome."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	add(err)
	o.advances, err = m.Int64Counter("fencelock.guard.advances", metric.WithUnit("{advance}"),
		metric.WithDescription("Store.Advance calls by outcome and reason: committed (the claim is recorded); rejected (stale_token, read_only, lease_lost); failed."))
	add(err)
	o.relayInstruments(m, add)
	o.tickInstruments(m, add)
	if cfg.backlog != nil {
		cfg.backlog.now = time.Now
		if cfg.now != nil {
			cfg.backlog.now = cfg.now
		}
		add(o.backlogGauge(m, cfg.backlog))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("fencelockotel: creating instruments: %w", err)
	}
	return o, nil
}

// attrs is a metric attribute set of the fixed attributes kv, plus the
// name when WithNameAttribute is on. Without names the sets are few and
// fixed: each is built once and reused.
func (o *Observer) attrs(nameKey attribute.Key, name string, kv ...attribute.KeyValue) metric.MeasurementOption {
	if o.names {
		return metric.WithAttributeSet(attribute.NewSet(append(kv, nameKey.String(name))...))
	}
	return o.fixed(kv...)
}

// fixed is the attribute set of the fixed attributes kv (at most two),
// built once and reused.
func (o *Observer) fixed(kv ...attribute.KeyValue) metric.MeasurementOption {
	var k setKey
	copy(k[:], kv)
	if m, ok := o.sets.Load(k); ok {
		return m.(metric.MeasurementOption)
	}
	m, _ := o.sets.LoadOrStore(k, metric.WithAttributeSet(attribute.NewSet(kv...)))
	return m.(metric.MeasurementOption)
}

// setKey is a fixed attribute set (at most two string attributes, which
// compare as values).
type setKey [2]attribute.KeyValue

// acquireOutcome is the outcome label of an acquisition.
func acquireOutcome(e fence.AcquireEvent) string {
	switch {
	case e.Err == nil && e.Reacquired:
		return "reacquired"
	case e.Err == nil:
		return "acquired"
	case errors.Is(e.Err, fence.ErrNotAcquired) && !outage(e.Err):
		return "not_acquired"
	}
	return "error"
}

// outage reports whether err, an acquisition that ended without the lock,
// carries the Redis failure its wait was riding out (fence joins the last
// one): a refused or broken connection, or a Redis error reply such as
// CLUSTERDOWN or LOADING. Such a wait ended because Redis could not be
// used, not because another holder had the lock.
func outage(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	var re redis.Error
	return errors.As(err, &op) || errors.As(err, &dns) || errors.As(err, &re) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// OnAcquire implements fence.AcquireObserver: a count by outcome, the wait
// time, and a "fence.Acquire" span covering the call.
func (o *Observer) OnAcquire(ctx context.Context, e fence.AcquireEvent) {
	outcome := acquireOutcome(e)
	set := o.attrs(KeyLockName, e.Name, KeyOutcome.String(outcome))
	o.acquisitions.Add(ctx, 1, set)
	o.wait.Record(ctx, e.Waited.Seconds(), set)

	end := time.Now()
	_, span := o.tracer.Start(ctx, "fence.Acquire", trace.WithTimestamp(end.Add(-e.Duration)),
		trace.WithSpanKind(trace.SpanKindClient))
	span.SetAttributes(KeyLockName.String(e.Name), KeyOutcome.String(outcome),
		KeyWaited.Float64(e.Waited.Seconds()))
	if e.Token != 0 {
		span.SetAttributes(KeyToken.Int64(e.Token))
	}
	if outcome == "error" {
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// OnRenew implements fence.RenewObserver: a count by outcome.
func (o *Observer) OnRenew(ctx context.Context, e fence.RenewEvent) {
	outcome := "ok"
	if e.Err != nil {
		outcome = "error"
	}
	o.renewals.Add(ctx, 1, o.attrs(KeyLockName, e.Name, KeyOutcome.String(outcome)))
}

// lossReason is the reason label of a loss.
func lossReason(err error) string {
	var le *fence.LostError
	switch {
	case errors.As(err, &le):
		return le.Reason.String()
	case errors.Is(err, fence.ErrMaxHold):
		return "max_hold"
	}
	return "other"
}

// OnLoss implements fence.LossObserver: a count by reason and the hold
// time (end=lost, or max_hold).
func (o *Observer) OnLoss(ctx context.Context, e fence.LossEvent) {
	reason := lossReason(e.Err)
	o.losses.Add(ctx, 1, o.attrs(KeyLockName, e.Name, KeyReason.String(reason)))
	end := "lost"
	if reason == "max_hold" {
		end = "max_hold"
	}
	o.hold.Record(ctx, e.Held.Seconds(), o.attrs(KeyLockName, e.Name, KeyEnd.String(end)))
}

// releaseOutcome is the outcome attribute of a release: released,
// not_held (lost, expired or released before: the loss, if any, was its
// own event), or error (Redis did not answer, say).
func releaseOutcome(err error) string {
	switch {
	case err == nil:
		return "released"
	case errors.Is(err, fence.ErrNotHeld):
		return "not_held"
	}
	return "error"
}

// OnRelease implements fence.ReleaseObserver: the hold time of a lock
// released while held (end=released), and a "fence.Release" span covering
// the call. A release that finds the lock lost was counted by OnLoss
// already; its span says not_held, without an error status (the loss is
// what to look at).
func (o *Observer) OnRelease(ctx context.Context, e fence.ReleaseEvent) {
	outcome := releaseOutcome(e.Err)
	if outcome == "released" {
		o.hold.Record(ctx, e.Held.Seconds(), o.attrs(KeyLockName, e.Name, KeyEnd.String("released")))
	}
	end := time.Now()
	_, span := o.tracer.Start(ctx, "fence.Release", trace.WithTimestamp(end.Add(-e.Duration)),
		trace.WithSpanKind(trace.SpanKindClient))
	span.SetAttributes(KeyLockName.String(e.Name), KeyToken.Int64(e.Token), KeyOutcome.String(outcome),
		KeyHeld.Float64(e.Held.Seconds()))
	if outcome == "error" {
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// spanError reports whether a guarded write's or claim's outcome marks its
// span as an error: a failure, an unknown outcome, or a refusal that
// means something is wrong (a stale holder, a lost lease, a read-only
// database). A key already applied and a finished run are the fence
// skipping a retry as asked: the outcome and reason attributes say so,
// and the status stays unset.
func spanError(outcome guard.Outcome, reason guard.Reason) bool {
	switch {
	case outcome == guard.Committed:
		return false
	case outcome == guard.Rejected && (reason == guard.ReasonAlreadyApplied || reason == guard.ReasonRunFinished):
		return false
	}
	return true
}

// OnExec implements guard.ExecObserver: a count by outcome and reason,
// the duration by outcome, and a "guard.Exec" span covering the call.
func (o *Observer) OnExec(ctx context.Context, e guard.ExecEvent) {
	outcome, reason := e.Outcome.String(), string(e.Reason)
	if reason == "" {
		reason = "none"
	}
	o.execs.Add(ctx, 1, o.attrs(KeyResource, e.Resource, KeyOutcome.String(outcome), KeyReason.String(reason)))
	o.execDur.Record(ctx, e.Duration.Seconds(), o.attrs(KeyResource, e.Resource, KeyOutcome.String(outcome)))

	end := time.Now()
	_, span := o.tracer.Start(ctx, "guard.Exec", trace.WithTimestamp(end.Add(-e.Duration)),
		trace.WithSpanKind(trace.SpanKindClient))
	span.SetAttributes(KeyResource.String(e.Resource), KeyToken.Int64(e.Token), KeyHolder.String(e.Holder),
		KeyOutcome.String(outcome), KeyReason.String(reason))
	if e.Key != "" {
		span.SetAttributes(KeyKey.String(e.Key))
	}
	if spanError(e.Outcome, e.Reason) && e.Err != nil {
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// OnAdvance implements guard.AdvanceObserver: a count by outcome and
// reason, and a "guard.Advance" span covering the call.
func (o *Observer) OnAdvance(ctx context.Context, e guard.AdvanceEvent) {
	outcome, reason := e.Outcome.String(), string(e.Reason)
	if reason == "" {
		reason = "none"
	}
	o.advances.Add(ctx, 1, o.attrs(KeyResource, e.Resource, KeyOutcome.String(outcome), KeyReason.String(reason)))
	end := time.Now()
	_, span := o.tracer.Start(ctx, "guard.Advance", trace.WithTimestamp(end.Add(-e.Duration)),
		trace.WithSpanKind(trace.SpanKindClient))
	span.SetAttributes(KeyResource.String(e.Resource), KeyToken.Int64(e.Token), KeyHolder.String(e.Holder),
		KeyOutcome.String(outcome), KeyReason.String(reason))
	if spanError(e.Outcome, e.Reason) && e.Err != nil {
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(trace.WithTimestamp(end))
}
