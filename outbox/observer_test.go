package outbox_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/outbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is an observer of every relay event.
type recorder struct {
	mu         sync.Mutex
	claims     []outbox.ClaimEvent
	deliveries []outbox.DeliveryEvent
	records    []outbox.RecordEvent
	errs       []outbox.ErrorEvent
}

var (
	_ outbox.ClaimObserver    = (*recorder)(nil)
	_ outbox.DeliveryObserver = (*recorder)(nil)
	_ outbox.RecordObserver   = (*recorder)(nil)
	_ outbox.ErrorObserver    = (*recorder)(nil)
)

func (r *recorder) OnClaim(_ context.Context, e outbox.ClaimEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.claims = append(r.claims, e)
}

func (r *recorder) OnDelivery(_ context.Context, e outbox.DeliveryEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deliveries = append(r.deliveries, e)
}

func (r *recorder) OnRecord(_ context.Context, e outbox.RecordEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, e)
}

func (r *recorder) OnRelayError(_ context.Context, e outbox.ErrorEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, e)
}

func (r *recorder) errors() []outbox.ErrorEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]outbox.ErrorEvent(nil), r.errs...)
}

func (r *recorder) claimed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.claims {
		n += c.Claimed
	}
	return n
}

// ctxChecker fails the test when an observer's ctx can be cancelled (Run's
// can).
type ctxChecker struct{ t *testing.T }

func (c ctxChecker) OnDelivery(ctx context.Context, _ outbox.DeliveryEvent) {
	if ctx.Done() != nil {
		c.t.Errorf("an observer's ctx carries a cancellation")
	}
}

// Every outcome a delivery can have reaches the observers, with the
// delivery it belongs to: delivered; already applied (a second effect of
// the same key at a fenced receiver, which answers with Fencing-Outcome);
// superseded (a fenced receiver that has seen a newer token: 409); retried
// (a 503), then delivered on its second attempt; dead (a 422). So does
// every claim (the rows it took add up to the attempts) and every record
// (one ack or retry statement per outcome, each row changed, but for the
// row whose claim another relay took meanwhile), and no error.
func TestRelayObservers(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	fenced, applied, fencedDB := fencedReceiverDB(t)
	_, err := fencedDB.Pool.Exec(ctx, `SELECT fencelock.advance('old', 5, 'newer')`)
	require.NoError(t, err)
	plain := newReceiver(t, func(r *http.Request, n int) int {
		switch r.Header.Get("Idempotency-Key") {
		case "flaky":
			if n == 0 {
				return http.StatusServiceUnavailable
			}
		case "bad":
			return http.StatusUnprocessableEntity
		case "stolen":
			// Another relay claims the row while this one sends it.
			_, err := db.Pool.Exec(ctx, `UPDATE fencelock.outbox SET claim = 42 WHERE key = 'stolen'`)
			require.NoError(t, err)
		}
		return http.StatusOK
	})
	for _, e := range []struct {
		resource string
		effect   outbox.Effect
	}{
		{"r", outbox.Effect{Destination: fenced.URL, Key: "ok", Payload: []byte("1")}},
		{"r", outbox.Effect{Destination: fenced.URL, Key: "ok", Payload: []byte("2")}},
		{"old", outbox.Effect{Destination: fenced.URL, Key: "stale"}},
		{"r", outbox.Effect{Destination: plain.URL, Key: "flaky"}},
		{"r", outbox.Effect{Destination: plain.URL, Key: "bad"}},
		{"r", outbox.Effect{Destination: plain.URL, Key: "stolen"}},
	} {
		require.NoError(t, raw(ctx, db.Pool, e.resource, 1, "h", e.effect))
	}
	var rec recorder
	// One send at a time: the two effects of key "ok" reach the receiver
	// one after the other.
	r := startRelay(t, db.Pool, httpSender(t), outbox.WithObserver(&rec), outbox.WithObserver(ctxChecker{t}),
		outbox.WithBatchSize(1), outbox.WithConcurrency(1), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithBackoff(10*time.Millisecond, 10*time.Millisecond), outbox.WithMaxAttempts(3))
	// The relay reports a record after the database has it: wait for the
	// seven attempts' records to be reported too, not only for the rows.
	eventually(t, func() bool {
		all, dead := rows(t, db.Pool)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		n := 0
		for _, e := range rec.records {
			n += e.Outcomes
		}
		return all == 2 && dead == 1 && n >= 7
	}, "all delivered but the dead row and the stolen one, and the seven attempts recorded")
	assert.Equal(t, map[string]int{"ok": 1}, applied())

	rec.mu.Lock()
	defer rec.mu.Unlock()
	byKey := map[string][]outbox.DeliveryOutcome{}
	for _, d := range rec.deliveries {
		byKey[d.Key] = append(byKey[d.Key], d.Outcome)
		assert.Equal(t, "h", d.Holder)
		assert.EqualValues(t, 1, d.Token)
		assert.Positive(t, d.ID)
		assert.Positive(t, d.Duration, d.Key)
		assert.WithinDuration(t, time.Now(), d.Recorded, time.Minute, d.Key)
		switch d.Outcome {
		case outbox.Delivered:
			assert.NoError(t, d.Err, d.Key)
		case outbox.AlreadyApplied:
			assert.ErrorIs(t, d.Err, guard.ErrAlreadyApplied)
			assert.Equal(t, fenced.URL, d.Destination)
		case outbox.Superseded:
			assert.ErrorIs(t, d.Err, outbox.ErrSuperseded)
			assert.Equal(t, "old", d.Resource)
		case outbox.Retried:
			assert.ErrorContains(t, d.Err, "503 Service Unavailable")
			assert.Equal(t, 1, d.Attempt)
		case outbox.Dead:
			assert.ErrorIs(t, d.Err, outbox.ErrTerminal)
			assert.Equal(t, 1, d.Attempt)
		}
	}
	assert.Equal(t, map[string][]outbox.DeliveryOutcome{
		"ok": {outbox.Delivered, outbox.AlreadyApplied}, "stale": {outbox.Superseded},
		"flaky": {outbox.Retried, outbox.Delivered}, "bad": {outbox.Dead}, "stolen": {outbox.Delivered},
	}, byKey)
	for _, o := range []outbox.DeliveryOutcome{outbox.Delivered, outbox.AlreadyApplied, outbox.Superseded, outbox.Retried, outbox.Dead} {
		assert.NotEqual(t, "invalid", o.String())
	}
	assert.Equal(t, "already_applied", outbox.AlreadyApplied.String())

	claimed := 0
	for _, c := range rec.claims {
		assert.LessOrEqual(t, c.Claimed, c.Limit)
		assert.Equal(t, 1, c.Limit, "batch 1, one send slot")
		claimed += c.Claimed
	}
	assert.Equal(t, len(rec.deliveries), claimed, "every attempt was claimed")

	outcomes := map[outbox.Op]int{}
	changed := map[outbox.Op]int{}
	for _, e := range rec.records {
		outcomes[e.Op] += e.Outcomes
		changed[e.Op] += e.Changed
		assert.Positive(t, e.Duration)
	}
	assert.Equal(t, map[outbox.Op]int{outbox.OpAck: 5, outbox.OpRetry: 2}, outcomes, "delivered ×3, already applied, superseded; retried, dead")
	assert.Equal(t, map[outbox.Op]int{outbox.OpAck: 4, outbox.OpRetry: 2}, changed, "all but the stolen row")
	assert.Empty(t, rec.errs)

	st := r.Stats()
	assert.Equal(t, outbox.RelayStats{Claimed: 7, Sent: 3, Failed: 1, Dead: 1, Superseded: 1, AlreadyApplied: 1}, st)
}

// Database trouble is an ErrorEvent per failed claim, counted in a row,
// naming the cause; a relay's stop is not one (TestRelayStopRecordsOutcome).
func TestRelayObserverErrors(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: "x", Key: "k"}))
	var rec recorder
	startRelay(t, db.Pool, outbox.SenderFunc(func(context.Context, outbox.Delivery) error { return nil }),
		outbox.WithObserver(&rec), outbox.WithPollInterval(time.Millisecond))
	eventually(t, func() bool { return rec.claimed() == 1 }, "the row claimed")
	_, err := db.Pool.Exec(ctx, `ALTER FUNCTION fencelock.outbox_claim(bigint, integer, interval, text) RENAME TO outbox_claim_gone`)
	require.NoError(t, err)
	eventually(t, func() bool { return len(rec.errors()) >= 3 }, "three failed claims")
	_, err = db.Pool.Exec(ctx, `ALTER FUNCTION fencelock.outbox_claim_gone(bigint, integer, interval, text) RENAME TO outbox_claim`)
	require.NoError(t, err)
	before := rec.claimed()
	require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: "x", Key: "k2"}))
	eventually(t, func() bool { return rec.claimed() == before+1 }, "claims again once the database is fine")
	for i, e := range rec.errors()[:3] {
		assert.Equal(t, outbox.OpClaim, e.Op)
		assert.Equal(t, i+1, e.Failures)
		assert.ErrorContains(t, e.Err, "outbox_claim")
		assert.ErrorContains(t, e.Err, "the fencelock schema lacks what the outbox needs (migrated down, or changed by hand, while in use?): migrate it up again")
	}
}

func TestWithObserverBadInput(t *testing.T) {
	db := newDB(t)
	s := outbox.SenderFunc(func(context.Context, outbox.Delivery) error { return nil })
	for _, o := range []any{nil, "not an observer", struct{}{}} {
		_, err := outbox.NewRelay(db.Pool, s, outbox.WithObserver(o))
		require.ErrorIs(t, err, outbox.ErrInvalidOption, "%T", o)
	}
	_, err := outbox.NewRelay(db.Pool, s, outbox.WithObserver(ctxChecker{t}))
	require.NoError(t, err, "an observer of deliveries alone")
}

// unlocked observes claims and errors in one slice, without a lock: the
// relay calls its observers from its loop only, which -race checks.
type unlocked struct{ events []any }

func (u *unlocked) OnClaim(_ context.Context, e outbox.ClaimEvent) { u.events = append(u.events, e) }
func (u *unlocked) OnRelayError(_ context.Context, e outbox.ErrorEvent) {
	u.events = append(u.events, e)
}

// A relay calls its observers from one goroutine, the failures of its
// LISTEN connection included: an observer without a lock sees the claims
// and the listen failure (the connection terminated by the server) without
// a data race, and the relay listens again.
func TestObserversOneGoroutine(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	var obs unlocked
	r, err := outbox.NewRelay(db.Pool, outbox.SenderFunc(func(context.Context, outbox.Delivery) error { return nil }),
		outbox.WithListen(), outbox.WithPollInterval(2*time.Millisecond), outbox.WithObserver(&obs), outbox.WithLogger(quiet))
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()

	listener := func(not int) int {
		var pid int
		eventually(t, func() bool {
			err := db.Pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
				WHERE datname = current_database() AND query = 'LISTEN fencelock_outbox' AND state = 'idle' AND pid <> $1`, not).Scan(&pid)
			require.NoError(t, err)
			return pid != 0
		}, "a connection listens")
		return pid
	}
	first := listener(0)
	time.Sleep(100 * time.Millisecond) // claims, while it listens
	var ok bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, first).Scan(&ok))
	require.True(t, ok)
	listener(first)
	time.Sleep(100 * time.Millisecond) // claims again
	stop()
	require.NoError(t, <-done)

	var claims int
	var errs []outbox.ErrorEvent
	for _, e := range obs.events {
		switch e := e.(type) {
		case outbox.ClaimEvent:
			claims++
		case outbox.ErrorEvent:
			errs = append(errs, e)
		}
	}
	assert.Positive(t, claims)
	require.Len(t, errs, 1, "the listen failure")
	assert.Equal(t, outbox.OpListen, errs[0].Op)
	assert.Equal(t, 1, errs[0].Failures)
}
