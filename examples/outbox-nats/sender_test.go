package natsoutbox_test

import (
	"context"
	"errors"
	"github.com/fencelock/fencelock/guard/guardtest"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	natsoutbox "github.com/fencelock/fencelock/examples/outbox-nats"
	"github.com/fencelock/fencelock/outbox"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An effect recorded in a fenced transaction reaches the stream once its
// transaction has committed: on its subject, with its payload, its own
// headers, the four fencing headers and MsgID of its subject, resource and
// key as Nats-Msg-Id.
func TestDeliveryHeaders(t *testing.T) {
	ns := newNATS(t)
	js := ns.connect(t)
	db := newDB(t)
	sender, err := natsoutbox.NewSender(js)
	require.NoError(t, err)
	relay := startRelay(t, db, sender)
	s := stream(t, js, relay.MaxRedeliveryDelay())

	record(t, db, guardtest.Lease{Resource: "stock-sync:eu", Tok: 42, Who: "worker-a"}, outbox.Effect{
		Destination: "nats://stock.eu", Key: "stock-sync:eu:batch-7", Payload: []byte(`{"sku-1": 5}`),
		Header: http.Header{"Content-Type": {"application/json"}, "X-Batch": {"7", "of 9"}},
	})
	drained(t, db)

	msgs := messages(t, s)
	require.Len(t, msgs, 1)
	m := msgs[0]
	assert.Equal(t, "stock.eu", m.Subject)
	assert.Equal(t, `{"sku-1": 5}`, string(m.Data))
	for name, want := range map[string][]string{
		"Idempotency-Key": {"stock-sync:eu:batch-7"}, "Nats-Msg-Id": {natsoutbox.MsgID("stock.eu", "stock-sync:eu", "stock-sync:eu:batch-7")},
		"Fencing-Token": {"42"}, "Fencing-Resource": {"stock-sync:eu"}, "Fencing-Holder": {"worker-a"},
		"Content-Type": {"application/json"}, "X-Batch": {"7", "of 9"},
	} {
		assert.Equal(t, want, m.Header.Values(name), "header %s", name)
	}
	assert.Equal(t, uint64(1), relay.Stats().Sent)
}

// flakyAck publishes for real, then reports the first attempt at each key
// as failed, as when the acknowledgement is lost (the server stores the
// message and its answer does not arrive within the send timeout). after,
// if set, runs between the publish and the failure.
type flakyAck struct {
	inner outbox.Sender
	after func()
	mu    sync.Mutex
	calls map[string]int
}

func (f *flakyAck) Send(ctx context.Context, d outbox.Delivery) error {
	err := f.inner.Send(ctx, d)
	f.mu.Lock()
	f.calls[d.Key]++
	first := f.calls[d.Key] == 1
	f.mu.Unlock()
	if err != nil || !first {
		return err
	}
	if f.after != nil {
		f.after()
	}
	return errors.New("test: the acknowledgement was lost")
}

func (f *flakyAck) count(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[key]
}

// The same effect published twice (the first acknowledgement lost) is
// stored once: the retry carries the same Nats-Msg-Id, within the window.
func TestSentTwiceStoredOnce(t *testing.T) {
	ns := newNATS(t)
	js := ns.connect(t)
	db := newDB(t)
	sender, err := natsoutbox.NewSender(js)
	require.NoError(t, err)
	flaky := &flakyAck{inner: sender, calls: map[string]int{}}
	relay := startRelay(t, db, flaky)
	s := stream(t, js, relay.MaxRedeliveryDelay())

	record(t, db, guardtest.Lease{Resource: "stock-sync:eu", Tok: 7, Who: "worker-a"},
		outbox.Effect{Destination: "nats://stock.eu", Key: "batch-1", Payload: []byte("one")},
		outbox.Effect{Destination: "nats://stock.us", Key: "batch-2", Payload: []byte("two")})
	drained(t, db)

	// Twice at least: a publish that overruns the send timeout on a
	// loaded machine is one more.
	assert.GreaterOrEqual(t, flaky.count("batch-1"), 2, "published twice")
	assert.GreaterOrEqual(t, flaky.count("batch-2"), 2, "published twice")
	msgs := messages(t, s)
	var keys, ids []string
	for _, m := range msgs {
		keys = append(keys, m.Header.Get("Idempotency-Key"))
		ids = append(ids, m.Header.Get("Nats-Msg-Id"))
	}
	assert.ElementsMatch(t, []string{"batch-1", "batch-2"}, keys, "stored once each")
	assert.ElementsMatch(t, []string{natsoutbox.MsgID("stock.eu", "stock-sync:eu", "batch-1"), natsoutbox.MsgID("stock.us", "stock-sync:eu", "batch-2")}, ids)
	st := relay.Stats()
	assert.GreaterOrEqual(t, st.Failed, uint64(2))
	assert.Equal(t, uint64(2), st.AlreadyApplied, "the stream acknowledged each retry as a duplicate")
	assert.Zero(t, st.Sent)
}

// Every failure the effect itself causes leaves a dead row at once, with
// the reason; a publish nobody acknowledges in time is retried.
func TestTerminalDeadRows(t *testing.T) {
	ns := newNATS(t)
	js := ns.connect(t)
	db := newDB(t)
	ctx := ctxT(t)
	stream(t, js, time.Minute)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 512})
	require.NoError(t, err)
	// A plain subscriber that never answers: a JetStream publish to its
	// subject waits for an acknowledgement that does not come.
	nc := js.Conn()
	sub, err := nc.SubscribeSync("slow.eu")
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	cases := []struct {
		effect outbox.Effect
		reason string
	}{
		{outbox.Effect{Destination: "https://shop.example/stock"}, "not a NATS destination"},
		{outbox.Effect{Destination: "nats://"}, "no subject after nats://"},
		{outbox.Effect{Destination: "nats://stock..eu"}, "empty token"},
		{outbox.Effect{Destination: "nats://stock.*"}, `wildcard "*"`},
		{outbox.Effect{Destination: "nats://stock eu"}, "whitespace"},
		{outbox.Effect{Destination: "nats://$JS.API.STREAM.DELETE.STOCK"}, "server's own APIs"},
		{outbox.Effect{Destination: "nats://nowhere.eu"}, "no JetStream stream takes this subject"},
		{outbox.Effect{Destination: "nats://stock.eu", Payload: make([]byte, outbox.MaxPayload)}, "larger than the server's max_payload"},
		{outbox.Effect{Destination: "nats://small.eu", Payload: make([]byte, 600)}, "message size exceeds maximum allowed"},
		{outbox.Effect{Destination: "nats://stock.eu", Header: http.Header{"Nats-Msg-Id": {"mine"}}}, "sets header Nats-Msg-Id"},
	}
	var effects []outbox.Effect
	for i, c := range cases {
		c.effect.Key = "dead-" + string(rune('a'+i))
		effects = append(effects, c.effect)
	}
	effects = append(effects, outbox.Effect{Destination: "nats://slow.eu", Key: "slow"})
	sender, err := natsoutbox.NewSender(js)
	require.NoError(t, err)
	record(t, db, guardtest.Lease{Resource: "stock-sync:eu", Tok: 9, Who: "worker-a"}, effects...)
	startRelay(t, db, sender, outbox.WithSendTimeout(300*time.Millisecond), outbox.WithVisibilityTimeout(1300*time.Millisecond))

	var dead []outbox.Row
	require.Eventually(t, func() bool {
		var err error
		dead, err = outbox.List(context.Background(), db.Pool, true, 100)
		return err == nil && len(dead) == len(cases)
	}, 30*time.Second, 20*time.Millisecond, "every terminal case ends as a dead row")
	byKey := map[string]outbox.Row{}
	for _, r := range dead {
		byKey[r.Key] = r
	}
	for i, c := range cases {
		r, ok := byKey["dead-"+string(rune('a'+i))]
		if !assert.True(t, ok, "%s: no dead row", c.effect.Destination) {
			continue
		}
		assert.Equal(t, 1, r.Attempts, "%s: dead at the first attempt", c.effect.Destination)
		assert.Contains(t, r.LastError, c.reason, c.effect.Destination)
		assert.Contains(t, r.LastError, "outbox: delivery refused for good", c.effect.Destination)
	}

	// The unanswered publish is retried, never dead.
	require.Eventually(t, func() bool {
		live, err := outbox.List(context.Background(), db.Pool, false, 10)
		return err == nil && len(live) == 1 && live[0].Attempts >= 2 && live[0].LastError != ""
	}, 30*time.Second, 20*time.Millisecond, "the unanswered publish is tried again")
	live, err := outbox.List(ctx, db.Pool, false, 10)
	require.NoError(t, err)
	require.Len(t, live, 1)
	assert.Equal(t, "slow", live[0].Key)
	assert.Contains(t, live[0].LastError, "no acknowledgement from JetStream")
	assert.NotContains(t, live[0].LastError, "refused for good")
	_, err = sub.NextMsg(5 * time.Second)
	assert.NoError(t, err, "the publish reached the subject")
}

// A server without JetStream: no stream can take the subject, terminal.
func TestNoJetStream(t *testing.T) {
	ns := startNATS(t, &natsServer{t: t, dir: t.TempDir(), port: -1, noJets: true})
	sender, err := natsoutbox.NewSender(ns.connect(t))
	require.NoError(t, err)
	err = sender.Send(ctxT(t), outbox.Delivery{Resource: "r", Token: 1, Holder: "h", Destination: "nats://stock.eu", Key: "k"})
	assert.ErrorIs(t, err, outbox.ErrTerminal)
	assert.ErrorContains(t, err, "enable JetStream on the server")
}

// Subject reads nats://<subject> destinations and says what is wrong with
// the others.
func TestSubject(t *testing.T) {
	for dest, want := range map[string]string{
		"nats://stock.eu": "stock.eu", "nats://stock": "stock", "nats://$KV.stock.eu": "$KV.stock.eu",
		"nats://stock.eu-west_1": "stock.eu-west_1",
	} {
		got, err := natsoutbox.Subject(dest)
		assert.NoError(t, err, dest)
		assert.Equal(t, want, got, dest)
	}
	for _, dest := range []string{
		"", "stock.eu", "NATS://stock.eu", "nats://", "nats://.stock", "nats://stock.", "nats://a..b", "nats://a.>",
		"nats://*", "nats://a\tb", "nats://a\nb", "nats://_INBOX.x", "nats://$SYS.REQ", "nats://\xff",
	} {
		_, err := natsoutbox.Subject(dest)
		assert.ErrorIs(t, err, natsoutbox.ErrBadDestination, "%q", dest)
		if err != nil {
			assert.False(t, strings.Contains(err.Error(), "\n"), "one line: %q", err)
		}
	}
	_, err := natsoutbox.NewSender(nil)
	assert.ErrorIs(t, err, natsoutbox.ErrNilJetStream)
}

// Two effects with the same key under two resources are two effects (the
// receivers dedupe by resource and key): the stream stores both, and a
// consumer running Receive applies both.
func TestSameKeyTwoResources(t *testing.T) {
	ns := newNATS(t)
	js := ns.connect(t)
	db := newDB(t)
	sender, err := natsoutbox.NewSender(js)
	require.NoError(t, err)
	relay := startRelay(t, db, sender)
	s := stream(t, js, relay.MaxRedeliveryDelay())

	record(t, db, guardtest.Lease{Resource: "stock-sync:eu", Tok: 3, Who: "worker-a"},
		outbox.Effect{Destination: "nats://stock.eu", Key: "batch-7", Payload: []byte("eu")})
	drained(t, db)
	record(t, db, guardtest.Lease{Resource: "stock-sync:us", Tok: 3, Who: "worker-b"},
		outbox.Effect{Destination: "nats://stock.us", Key: "batch-7", Payload: []byte("us")})
	drained(t, db)

	msgs := messages(t, s)
	require.Len(t, msgs, 2, "the stream holds both effects")
	assert.NotEqual(t, msgs[0].Header.Get("Nats-Msg-Id"), msgs[1].Header.Get("Nats-Msg-Id"))
	st := relay.Stats()
	assert.Equal(t, uint64(2), st.Sent)
	assert.Zero(t, st.AlreadyApplied, "neither is taken for a copy of the other")

	cdb, store := consumerDB(t)
	c := pullConsumer(t, s)
	for range 2 {
		m := next(t, c, 5*time.Second)
		require.NotNil(t, m, "a message is waiting")
		require.NoError(t, natsoutbox.Receive(ctxT(t), store, m, applyStock))
	}
	got := levels(t, cdb)
	require.Len(t, got, 2, "the consumer applied both")
	assert.ElementsMatch(t, []level{{"batch-7", "stock-sync:eu", 3, "eu"}, {"batch-7", "stock-sync:us", 3, "us"}}, got)
	settled(t, c)
}

// The stream's identity of an effect is its subject, resource and key: the
// same resource and key on another subject is stored too, and a second
// transaction (a newer token) recording the same resource, key and subject
// is taken for a copy, as a fenced receiver would apply it once.
func TestMsgIDIdentity(t *testing.T) {
	ns := newNATS(t)
	js := ns.connect(t)
	db := newDB(t)
	sender, err := natsoutbox.NewSender(js)
	require.NoError(t, err)
	relay := startRelay(t, db, sender)
	s := stream(t, js, relay.MaxRedeliveryDelay())

	record(t, db, guardtest.Lease{Resource: "stock-sync:eu", Tok: 3, Who: "worker-a"},
		outbox.Effect{Destination: "nats://stock.eu", Key: "batch-7", Payload: []byte("levels")},
		outbox.Effect{Destination: "nats://stock.audit", Key: "batch-7", Payload: []byte("audit")})
	drained(t, db)
	record(t, db, guardtest.Lease{Resource: "stock-sync:eu", Tok: 4, Who: "worker-b"},
		outbox.Effect{Destination: "nats://stock.eu", Key: "batch-7", Payload: []byte("again")})
	drained(t, db)

	msgs := messages(t, s)
	var got []string
	for _, m := range msgs {
		got = append(got, m.Subject+" "+string(m.Data)+" "+m.Header.Get("Fencing-Token"))
	}
	assert.ElementsMatch(t, []string{"stock.eu levels 3", "stock.audit audit 3"}, got, "one message per subject, the second transaction's a copy")
	st := relay.Stats()
	assert.Equal(t, uint64(2), st.Sent)
	assert.Equal(t, uint64(1), st.AlreadyApplied, "token 4's effect is a copy of token 3's")
}

// MsgID is a fixed function of its three parts (consumers may compute it)
// and tells apart triples whose concatenations are equal.
func TestMsgID(t *testing.T) {
	// sha256sum of "8:stock.eu13:stock-sync:eubatch-7"
	assert.Equal(t, "41fe42c58b95e35dddb355c7be5e0bfe1e23db259bedaf06a749e21b97ca360b", natsoutbox.MsgID("stock.eu", "stock-sync:eu", "batch-7"))
	ids := map[string][3]string{}
	for _, in := range [][3]string{
		{"stock.eu", "stock-sync:eu", "batch-7"}, {"stock.eu", "stock-sync:us", "batch-7"},
		{"stock.us", "stock-sync:eu", "batch-7"}, {"stock.eu", "stock-sync:eu", "batch-8"},
		{"a", "b:c", "d"}, {"a", "b", ":cd"}, {"ab", "", "cd"}, {"a", "bc", "d"}, {"a", "b", "cd"}, {"a", "", "bcd"},
		{"a", "1:b", ""}, {"a1", ":b", ""},
	} {
		id := natsoutbox.MsgID(in[0], in[1], in[2])
		assert.Regexp(t, "^[0-9a-f]{64}$", id)
		if prev, ok := ids[id]; ok {
			t.Errorf("MsgID%q = MsgID%q", in, prev)
		}
		ids[id] = in
	}
}
