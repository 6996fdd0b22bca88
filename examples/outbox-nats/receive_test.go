package natsoutbox_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	natsoutbox "github.com/fencelock/fencelock/examples/outbox-nats"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// consumerDB is the consumer's own database: the fencelock schema and a
// table the deliveries are applied to, without a unique key, so that an
// effect applied twice shows as two rows.
func consumerDB(t testing.TB) (*testenv.DB, *pgfence.Store) {
	t.Helper()
	db := newDB(t)
	_, err := db.Pool.Exec(ctxT(t), `CREATE TABLE stock_levels (key text, resource text, token bigint, body text, content_type text, destination text)`)
	require.NoError(t, err)
	store, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	return db, store
}

func applyStock(ctx context.Context, tx pgx.Tx, d outbox.Delivery) error {
	_, err := tx.Exec(ctx, `INSERT INTO stock_levels VALUES ($1, $2, $3, $4, $5, $6)`,
		d.Key, d.Resource, d.Token, string(d.Payload), d.Header.Get("Content-Type"), d.Destination)
	return err
}

type level struct {
	key, resource string
	token         int64
	body          string
}

func levels(t testing.TB, db *testenv.DB) []level {
	t.Helper()
	rows, err := db.Pool.Query(ctxT(t), `SELECT key, resource, token, body FROM stock_levels ORDER BY key`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (level, error) {
		var l level
		return l, r.Scan(&l.key, &l.resource, &l.token, &l.body)
	})
	require.NoError(t, err)
	return out
}

// pullConsumer is a durable consumer of the stream with explicit acks.
func pullConsumer(t testing.TB, s jetstream.Stream) jetstream.Consumer {
	t.Helper()
	c, err := s.CreateOrUpdateConsumer(ctxT(t), jetstream.ConsumerConfig{Durable: "apply", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second})
	require.NoError(t, err)
	return c
}

// next fetches the consumer's next message, waiting up to wait.
func next(t testing.TB, c jetstream.Consumer, wait time.Duration) jetstream.Msg {
	t.Helper()
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(wait))
	require.NoError(t, err)
	var got jetstream.Msg
	for m := range batch.Messages() {
		got = m
	}
	require.NoError(t, batch.Error())
	return got
}

// settled waits until the consumer has no message delivered and not yet
// acknowledged, and none left to deliver.
func settled(t testing.TB, c jetstream.Consumer) {
	t.Helper()
	require.Eventually(t, func() bool {
		info, err := c.Info(context.Background())
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, 10*time.Second, 20*time.Millisecond, "the consumer never settled every message")
}

// A consumer that runs Receive applies an effect once although the stream
// stored it twice (published again after the duplicate window), refuses
// one whose token is older than one it applied for the resource, and one
// without fencing headers; each is acknowledged or terminated, none comes
// again.
func TestReceive(t *testing.T) {
	ns := newNATS(t)
	js := ns.connect(t)
	ctx := ctxT(t)
	s := stream(t, js, 100*time.Millisecond)
	sender, err := natsoutbox.NewSender(js)
	require.NoError(t, err)
	db, store := consumerDB(t)

	newer := outbox.Delivery{Resource: "stock-sync:eu", Token: 20, Holder: "worker-b", Destination: "nats://stock.eu",
		Key: "sync:eu:batch-8", Payload: []byte("eight"), Header: http.Header{"Content-Type": {"application/json"}}}
	older := outbox.Delivery{Resource: "stock-sync:eu", Token: 10, Holder: "worker-a", Destination: "nats://stock.eu",
		Key: "sync:eu:batch-9", Payload: []byte("late")}
	require.NoError(t, sender.Send(ctx, newer))
	time.Sleep(300 * time.Millisecond) // past the duplicate window: stored again
	require.NoError(t, sender.Send(ctx, newer))
	require.NoError(t, sender.Send(ctx, older))
	_, err = js.Publish(ctx, "stock.eu", []byte("no fencing headers"))
	require.NoError(t, err)
	require.Len(t, messages(t, s), 4, "the stream holds both copies of the first effect")

	c := pullConsumer(t, s)
	var errs []error
	for range 4 {
		m := next(t, c, 5*time.Second)
		require.NotNil(t, m, "a message is waiting")
		errs = append(errs, natsoutbox.Receive(ctx, store, m, applyStock))
	}
	assert.NoError(t, errs[0], "applied")
	assert.ErrorIs(t, errs[1], guard.ErrAlreadyApplied, "the second copy")
	assert.ErrorIs(t, errs[2], guard.ErrStaleToken, "token 10 after token 20")
	assert.ErrorIs(t, errs[3], outbox.ErrBadDelivery, "no fencing headers")
	assert.Contains(t, errs[3].Error(), "header Fencing-Resource missing")

	assert.Equal(t, []level{{"sync:eu:batch-8", "stock-sync:eu", 20, "eight"}}, levels(t, db), "applied once, the stale one not at all")
	var ct, dest string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT content_type, destination FROM stock_levels`).Scan(&ct, &dest))
	assert.Equal(t, "application/json", ct, "the effect's own headers reach apply")
	assert.Equal(t, "nats://stock.eu", dest)
	settled(t, c)
	assert.Nil(t, next(t, c, 300*time.Millisecond), "nothing is delivered again")
}

// An apply that fails is retried: Receive naks the message, which comes
// again (after a second) and is applied then, once. One that apply
// refuses for good is terminated.
func TestReceiveRetries(t *testing.T) {
	ns := newNATS(t)
	js := ns.connect(t)
	ctx := ctxT(t)
	s := stream(t, js, time.Minute)
	sender, err := natsoutbox.NewSender(js)
	require.NoError(t, err)
	db, store := consumerDB(t)
	d := outbox.Delivery{Resource: "stock-sync:eu", Token: 5, Holder: "worker-a", Destination: "nats://stock.eu", Key: "k1", Payload: []byte("one")}
	require.NoError(t, sender.Send(ctx, d))
	d.Key, d.Payload = "k2", []byte("two")
	require.NoError(t, sender.Send(ctx, d))
	c := pullConsumer(t, s)

	busy := errors.New("test: the stock table is busy")
	failing := func(ctx context.Context, tx pgx.Tx, d outbox.Delivery) error {
		if err := applyStock(ctx, tx, d); err != nil {
			return err
		}
		return busy // rolls the insert back
	}
	m := next(t, c, 5*time.Second)
	require.NotNil(t, m)
	assert.ErrorIs(t, natsoutbox.Receive(ctx, store, m, failing), busy)
	refuse := func(context.Context, pgx.Tx, outbox.Delivery) error {
		return outbox.Terminal(errors.New("test: unknown sku"))
	}
	m = next(t, c, 5*time.Second)
	require.NotNil(t, m)
	assert.Equal(t, "k2", m.Headers().Get("Idempotency-Key"))
	assert.ErrorIs(t, natsoutbox.Receive(ctx, store, m, refuse), outbox.ErrTerminal)

	start := time.Now()
	m = next(t, c, 5*time.Second)
	require.NotNil(t, m, "the failed message comes again")
	assert.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond, "after the nak's delay")
	assert.Equal(t, "k1", m.Headers().Get("Idempotency-Key"))
	md, err := m.Metadata()
	require.NoError(t, err)
	assert.Equal(t, uint64(2), md.NumDelivered)
	require.NoError(t, natsoutbox.Receive(ctx, store, m, applyStock))
	assert.Equal(t, []level{{"k1", "stock-sync:eu", 5, "one"}}, levels(t, db))
	settled(t, c)
	assert.Nil(t, next(t, c, 300*time.Millisecond), "the refused one is not delivered again")
}
