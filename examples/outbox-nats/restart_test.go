package natsoutbox_test

import (
	"context"
	"github.com/fencelock/fencelock/guard/guardtest"
	"testing"
	"time"

	natsoutbox "github.com/fencelock/fencelock/examples/outbox-nats"
	"github.com/fencelock/fencelock/outbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The NATS server dies right after storing an effect, before its
// acknowledgement reaches the relay; another effect is recorded while it
// is down. Both are retried (none dead), and once the server is back on
// the same store each is stored once: the first one's retry is a
// duplicate of the copy stored before the restart.
func TestServerRestart(t *testing.T) {
	ns := newNATS(t)
	js := ns.connect(t)
	db := newDB(t)
	sender, err := natsoutbox.NewSender(js)
	require.NoError(t, err)
	stopped := make(chan struct{})
	flaky := &flakyAck{inner: sender, calls: map[string]int{}, after: func() {
		ns.Stop()
		close(stopped)
	}}
	relay := startRelay(t, db, flaky)
	s := stream(t, js, relay.MaxRedeliveryDelay())

	l := guardtest.Lease{Resource: "stock-sync:eu", Tok: 11, Who: "worker-a"}
	record(t, db, l, outbox.Effect{Destination: "nats://stock.eu", Key: "before", Payload: []byte("stored, ack lost")})
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never published the first effect")
	}
	record(t, db, l, outbox.Effect{Destination: "nats://stock.eu", Key: "during", Payload: []byte("recorded while down")})
	// Attempts fail while the server is down, and are retried.
	var live []outbox.Row
	require.Eventually(t, func() bool {
		live, err = outbox.List(context.Background(), db.Pool, false, 10)
		return err == nil && len(live) == 2 && live[0].Attempts >= 3 && live[1].Attempts >= 3
	}, 30*time.Second, 20*time.Millisecond, "the relay kept trying while the server was down")
	for _, r := range live {
		t.Logf("%s, attempt %d while down: %s", r.Key, r.Attempts, r.LastError)
		assert.NotContains(t, r.LastError, "refused for good", r.Key)
		assert.Contains(t, r.LastError, "not connected to a NATS server", r.Key)
	}
	dead, err := outbox.List(ctxT(t), db.Pool, true, 10)
	require.NoError(t, err)
	assert.Empty(t, dead, "a server that is down kills no effect")

	ns.Start()
	drained(t, db)
	msgs := messages(t, s)
	var keys []string
	for _, m := range msgs {
		keys = append(keys, m.Header.Get("Idempotency-Key"))
	}
	assert.Equal(t, []string{"before", "during"}, keys, "each effect stored once")
	assert.GreaterOrEqual(t, flaky.count("before"), 2, "the first effect was published again after the restart")
	assert.GreaterOrEqual(t, flaky.count("during"), 2, "the second effect was tried while the server was down")
	assert.GreaterOrEqual(t, relay.Stats().AlreadyApplied, uint64(1), "the restarted server knew the first effect's id")
}
