package fencelockotel

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fencelock/fencelock/outbox"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of the outbox relay's metrics and spans.
const (
	KeyOp          = attribute.Key("fencelock.op")
	KeyState       = attribute.Key("fencelock.state")
	KeyDestination = attribute.Key("fencelock.outbox.destination")
	KeyAttempt     = attribute.Key("fencelock.outbox.attempt")
)

var (
	_ outbox.ClaimObserver    = (*Observer)(nil)
	_ outbox.DeliveryObserver = (*Observer)(nil)
	_ outbox.RecordObserver   = (*Observer)(nil)
	_ outbox.ErrorObserver    = (*Observer)(nil)
)

// Defaults of WithOutboxBacklog.
const (
	// DefaultBacklogInterval is how long a backlog reading serves.
	DefaultBacklogInterval = 30 * time.Second
	// backlogTimeout bounds one reading.
	backlogTimeout = 10 * time.Second
)

// relayInstruments are the outbox relay's instruments.
type relayInstruments struct {
	claimed   metric.Int64Counter
	claimDur  metric.Float64Histogram
	delivered metric.Int64Counter
	sendDur   metric.Float64Histogram
	lag       metric.Float64Histogram
	recorded  metric.Int64Counter
	errors    metric.Int64Counter
}

// lagBuckets are seconds from an effect's commit to an attempt: an
// in-process wake-up takes a millisecond or less, a poll a fraction of a
// second, a backoff up to minutes, a receiver down for long hours.
var lagBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 4 * 3600}

func (o *Observer) relayInstruments(m metric.Meter, add func(error)) {
	var err error
	r := &o.relay
	r.claimed, err = m.Int64Counter("fencelock.outbox.claimed", metric.WithUnit("{row}"),
		metric.WithDescription("Outbox rows claimed by relays (each is an attempt at a delivery)."))
	add(err)
	r.claimDur, err = m.Float64Histogram("fencelock.outbox.claim.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of a relay's claim of due rows."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	add(err)
	r.delivered, err = m.Int64Counter("fencelock.outbox.deliveries", metric.WithUnit("{delivery}"),
		metric.WithDescription("Attempts at delivering an effect by outcome: delivered, already_applied (the receiver had it), superseded (409: the receiver has a newer token), retried, dead."))
	add(err)
	r.sendDur, err = m.Float64Histogram("fencelock.outbox.send.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of a Send, by outcome."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	add(err)
	r.lag, err = m.Float64Histogram("fencelock.outbox.delivery.lag", metric.WithUnit("s"),
		metric.WithDescription("Time from the commit that recorded an effect to the end of an attempt at delivering it, by outcome (the database's clock against the relay's)."),
		metric.WithExplicitBucketBoundaries(lagBuckets...))
	add(err)
	r.recorded, err = m.Int64Counter("fencelock.outbox.recorded", metric.WithUnit("{outcome}"),
		metric.WithDescription("Outcomes recorded by relays, by op (ack: rows deleted; retry: rescheduled or dead) and outcome: changed, or claim_lost (another relay had claimed the row meanwhile and sends it again)."))
	add(err)
	r.errors, err = m.Int64Counter("fencelock.outbox.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Database errors relays waited through, by op (ready, claim, ack, retry, listen; backlog: a reading of WithOutboxBacklog)."))
	add(err)
}

// OnClaim implements outbox.ClaimObserver: the rows claimed and the
// claim's duration.
func (o *Observer) OnClaim(ctx context.Context, e outbox.ClaimEvent) {
	if e.Claimed > 0 {
		o.relay.claimed.Add(ctx, int64(e.Claimed))
	}
	o.relay.claimDur.Record(ctx, e.Duration.Seconds())
}

// sendError reports whether a delivery's outcome marks its span as an
// error: a failed attempt (retried) or a dead row. A delivery the
// receiver had already applied, or refused as superseded by a newer token
// (409), is the fence at work: the outcome attribute says so, and the
// status stays unset.
func sendError(o outbox.DeliveryOutcome) bool {
	return o == outbox.Retried || o == outbox.Dead
}

// OnDelivery implements outbox.DeliveryObserver: a count by outcome, the
// Send's duration and the lag since the commit by outcome, and an
// "outbox.Send" span covering the Send.
func (o *Observer) OnDelivery(ctx context.Context, e outbox.DeliveryEvent) {
	outcome := e.Outcome.String()
	set := o.attrs(KeyResource, e.Resource, KeyOutcome.String(outcome))
	o.relay.delivered.Add(ctx, 1, set)
	o.relay.sendDur.Record(ctx, e.Duration.Seconds(), set)
	end := time.Now()
	if !e.Recorded.IsZero() {
		o.relay.lag.Record(ctx, max(end.Sub(e.Recorded), 0).Seconds(), set)
	}

	_, span := o.tracer.Start(ctx, "outbox.Send", trace.WithTimestamp(end.Add(-e.Duration)),
		trace.WithSpanKind(trace.SpanKindProducer))
	span.SetAttributes(KeyResource.String(e.Resource), KeyToken.Int64(e.Token), KeyHolder.String(e.Holder),
		KeyKey.String(e.Key), KeyDestination.String(outbox.RedactDestination(e.Destination)), KeyAttempt.Int(e.Attempt),
		KeyOutcome.String(outcome))
	if sendError(e.Outcome) && e.Err != nil {
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// OnRecord implements outbox.RecordObserver: the outcomes recorded by op,
// those whose row another claim had taken as claim_lost.
func (o *Observer) OnRecord(ctx context.Context, e outbox.RecordEvent) {
	if e.Changed > 0 {
		o.relay.recorded.Add(ctx, int64(e.Changed), o.fixed(KeyOp.String(string(e.Op)), KeyOutcome.String("changed")))
	}
	if lost := e.Outcomes - e.Changed; lost > 0 {
		o.relay.recorded.Add(ctx, int64(lost), o.fixed(KeyOp.String(string(e.Op)), KeyOutcome.String("claim_lost")))
	}
}

// OnRelayError implements outbox.ErrorObserver: a count by op.
func (o *Observer) OnRelayError(ctx context.Context, e outbox.ErrorEvent) {
	o.relay.errors.Add(ctx, 1, o.fixed(KeyOp.String(string(e.Op))))
}

// WithOutboxBacklog adds the gauge fencelock.outbox.backlog: the rows of
// db's fencelock.outbox by state (due, waiting, claimed, dead), as
// outbox.Backlog counts them: over indexes, at most
// outbox.DefaultBacklogLimit rows per state, so that a reading costs the
// same with a backlog of millions as with one of thousands. A count
// saturates at that limit: the gauge fencelock.outbox.backlog.capped is 1
// for a state whose count may be short (its rows reached the limit), 0
// otherwise. A reading is taken at most once per every (0:
// DefaultBacklogInterval; at least a second), however often metrics are
// collected and by however many readers: collections in between report
// the last reading. A reading is bounded by a timeout (10 s, or the
// collection's deadline); one that fails reports no value and counts an
// error (fencelock.outbox.errors, op backlog). One process per database is
// enough.
func WithOutboxBacklog(db outbox.DB, every time.Duration) Option {
	return optionFunc(func(c *config) error {
		if db == nil {
			return fmt.Errorf("%w: WithOutboxBacklog(nil, ...): pass the *pgxpool.Pool of the outbox's database", ErrInvalidOption)
		}
		if every == 0 {
			every = DefaultBacklogInterval
		}
		if every < time.Second {
			return fmt.Errorf("%w: WithOutboxBacklog: interval %v: give at least 1s, or 0 for the default (%v)", ErrInvalidOption, every, DefaultBacklogInterval)
		}
		c.backlog = &backlog{db: db, every: every}
		return nil
	})
}

// backlog is the reading of WithOutboxBacklog.
type backlog struct {
	db    outbox.DB
	every time.Duration
	now   func() time.Time

	mu     sync.Mutex // one reading at a time; collections wait for it
	at     time.Time  // when the last reading was taken
	counts outbox.CappedCounts
	err    error
}

// read returns the last reading, taking a new one when it is older than
// every.
func (b *backlog) read(ctx context.Context) (outbox.CappedCounts, error, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	fresh := b.at.IsZero() || now.Sub(b.at) >= b.every
	if fresh {
		b.at = now
		rctx, cancel := context.WithTimeout(ctx, backlogTimeout)
		b.counts, b.err = outbox.Backlog(rctx, b.db, outbox.DefaultBacklogLimit)
		cancel()
	}
	return b.counts, b.err, fresh
}

func (o *Observer) backlogGauge(m metric.Meter, b *backlog) error {
	states := [...]string{"due", "waiting", "claimed", "dead"}
	var sets [len(states)]metric.ObserveOption
	for i, s := range states {
		sets[i] = metric.WithAttributeSet(attribute.NewSet(KeyState.String(s)))
	}
	rows, err := m.Int64ObservableGauge("fencelock.outbox.backlog", metric.WithUnit("{row}"),
		metric.WithDescription(fmt.Sprintf("Rows of fencelock.outbox by state: due (may be claimed now), waiting (backing off), claimed (held by a relay), dead (until requeued); at most %d each (fencelock.outbox.backlog.capped says when there may be more). Read at most once per WithOutboxBacklog's interval.", outbox.DefaultBacklogLimit)))
	if err != nil {
		return err
	}
	capped, err := m.Int64ObservableGauge("fencelock.outbox.backlog.capped", metric.WithUnit("1"),
		metric.WithDescription(fmt.Sprintf("1 when fencelock.outbox.backlog's count of the state may be short: its rows reached the %d it counts up to; else 0.", outbox.DefaultBacklogLimit)))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		c, err, fresh := b.read(ctx)
		if err != nil {
			if fresh {
				o.relay.errors.Add(context.WithoutCancel(ctx), 1, o.fixed(KeyOp.String("backlog")))
			}
			return nil // no value: the reading failed
		}
		for i, n := range [...]int64{c.Due, c.Waiting, c.Claimed, c.Dead} {
			obs.ObserveInt64(rows, n, sets[i])
		}
		for i, short := range [...]bool{c.Capped.Due, c.Capped.Waiting, c.Capped.Claimed, c.Capped.Dead} {
			var v int64
			if short {
				v = 1
			}
			obs.ObserveInt64(capped, v, sets[i])
		}
		return nil
	}, rows, capped)
	return err
}
