package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A relay stopped while it sends, or while it records an outcome (its
// statement waiting on the server, held there by a row lock until after
// the stop), finishes the send and the record before Run returns, and does
// not take its own stop for database trouble: nothing is logged at Warn,
// and observers get no ErrorEvent.
// Once Run has returned, a delivered row is deleted and a failed one is
// free again with its attempt recorded, not left to its claim's
// visibility timeout.
func TestRelayStopRecordsOutcome(t *testing.T) {
	for _, c := range []struct {
		name     string
		inFlight bool
		fail     bool
	}{
		{"delivered, send in flight", false, false},
		{"delivered, record in flight", true, false},
		{"failed, send in flight", false, true},
		{"failed, record in flight", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := newDB(t)
			ctx := ctxT(t)
			require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: "x", Key: "k"}))
			blocker, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = blocker.Rollback(context.WithoutCancel(ctx)) }()

			rctx, stop := context.WithCancel(ctx)
			defer stop()
			sender := outbox.SenderFunc(func(context.Context, outbox.Delivery) error {
				if c.inFlight {
					// The claim has committed: this lock holds the record
					// of the outcome on the server.
					if _, err := blocker.Exec(ctx, `SELECT FROM fencelock.outbox WHERE key = 'k' FOR UPDATE`); err != nil {
						return err
					}
				} else {
					stop()
					time.Sleep(100 * time.Millisecond) // the stop reaches the relay while it sends
				}
				if c.fail {
					return errors.New("receiver down")
				}
				return nil
			})
			var logs syncBuf
			var rec recorder
			r, err := outbox.NewRelay(db.Pool, sender, outbox.WithPollInterval(time.Hour), outbox.WithObserver(&rec),
				outbox.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() { done <- r.Run(rctx) }()

			if c.inFlight {
				fn := "outbox_ack"
				if c.fail {
					fn = "outbox_retry"
				}
				waitLocked(t, db, fn)
				stop()
				time.Sleep(200 * time.Millisecond) // the stop reaches the relay while its record waits
				require.NoError(t, blocker.Rollback(ctx))
			}
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(time.Minute):
				t.Fatal("Run did not return within a minute of its context ending")
			}

			all, dead := rows(t, db.Pool)
			if c.fail {
				assert.Equal(t, 1, all)
				var attempts int
				var claimed bool
				var lastErr string
				require.NoError(t, db.Pool.QueryRow(ctx, `SELECT attempts, claim IS NOT NULL, last_error FROM fencelock.outbox`).Scan(&attempts, &claimed, &lastErr))
				assert.False(t, claimed, "the failed attempt is recorded: the row is free again")
				assert.Equal(t, "receiver down", lastErr)
				assert.Equal(t, 1, attempts)
				assert.Zero(t, dead)
			} else {
				assert.Zero(t, all, "the delivered row is deleted when Run returns")
			}
			assert.Empty(t, logs.String(), "nothing logged at Warn: the relay's stop is not database trouble")
			assert.Empty(t, rec.errors(), "no ErrorEvent")
		})
	}
}

// A relay stopped while its claim waits on the server (held there by a
// table lock until after the stop) finishes the claim, sends what it
// claimed and records it before Run returns: no row is left claimed by a
// relay that is gone, and nothing is logged at Warn or reported as an
// error.
func TestRelayStopFinishesClaim(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: "x", Key: "k"}))
	blocker, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(context.WithoutCancel(ctx)) }()
	_, err = blocker.Exec(ctx, `LOCK TABLE fencelock.outbox IN EXCLUSIVE MODE`)
	require.NoError(t, err)

	var sent atomic.Int64
	sender := outbox.SenderFunc(func(context.Context, outbox.Delivery) error { sent.Add(1); return nil })
	var logs syncBuf
	var rec recorder
	r, err := outbox.NewRelay(db.Pool, sender, outbox.WithPollInterval(time.Hour), outbox.WithObserver(&rec),
		outbox.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	waitLocked(t, db, "outbox_claim")
	stop()
	time.Sleep(200 * time.Millisecond) // the stop reaches the relay while its claim waits
	require.NoError(t, blocker.Rollback(ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of its context ending")
	}
	all, _ := rows(t, db.Pool)
	assert.Zero(t, all, "the claimed row was sent and its delivery recorded")
	assert.EqualValues(t, 1, sent.Load())
	assert.Empty(t, logs.String(), "nothing logged at Warn: the relay's stop is not database trouble")
	assert.Empty(t, rec.errors(), "no ErrorEvent")
}

// waitLocked waits until a statement calling fn waits for a lock.
func waitLocked(t *testing.T, db *testenv.DB, fn string) {
	t.Helper()
	eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctxT(t), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, fn).Scan(&n))
		return n == 1
	}, "a statement calling %s waits for a lock", fn)
}
