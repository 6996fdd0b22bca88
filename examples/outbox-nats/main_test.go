package natsoutbox_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/outbox/outboxtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// natsServer is a NATS server with JetStream, in the test's process, on
// 127.0.0.1, storing its streams in a directory that outlives a restart.
type natsServer struct {
	t      testing.TB
	dir    string
	port   int
	noJets bool // a server without JetStream
	mu     sync.Mutex
	srv    *server.Server
}

// newNATS starts a NATS server with JetStream; it is stopped at the end of
// the test.
func newNATS(t testing.TB) *natsServer {
	t.Helper()
	return startNATS(t, &natsServer{t: t, dir: t.TempDir(), port: -1})
}

func startNATS(t testing.TB, ns *natsServer) *natsServer {
	t.Helper()
	ns.Start()
	t.Cleanup(ns.Stop)
	return ns
}

// Start starts the server (again), on the same port and store.
func (ns *natsServer) Start() {
	ns.t.Helper()
	ns.mu.Lock()
	defer ns.mu.Unlock()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: ns.port, NoLog: true, NoSigs: true,
		JetStream: !ns.noJets, StoreDir: ns.dir, JetStreamMaxMemory: 64 << 20, JetStreamMaxStore: 256 << 20,
	})
	require.NoError(ns.t, err, "nats-server: NewServer")
	srv.Start()
	require.True(ns.t, srv.ReadyForConnections(10*time.Second), "nats-server did not accept connections within 10s")
	if ns.port == -1 {
		ns.port = srv.Addr().(*net.TCPAddr).Port
	}
	ns.srv = srv
}

// Stop shuts the server down and waits until it has.
func (ns *natsServer) Stop() {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.srv != nil {
		ns.srv.Shutdown()
		ns.srv.WaitForShutdown()
		ns.srv = nil
	}
}

func (ns *natsServer) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(ns.port) }

// connect is a client that reconnects for as long as the test runs.
func (ns *natsServer) connect(t testing.TB) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(ns.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// stream adds a stream on subjects stock.>, deduplicating within window.
func stream(t testing.TB, js jetstream.JetStream, window time.Duration) jetstream.Stream {
	t.Helper()
	s, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{
		Name: "STOCK", Subjects: []string{"stock.>"}, Storage: jetstream.FileStorage, Duplicates: window,
	})
	require.NoError(t, err)
	return s
}

// messages returns every message the stream holds, in order.
func messages(t testing.TB, s jetstream.Stream) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := ctxT(t)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		out = append(out, m)
	}
	return out
}

// newDB is a fresh database with the fencelock schema.
func newDB(t testing.TB) *testenv.DB {
	t.Helper()
	db := testenv.NewDB(t)
	sdb := stdlib.OpenDBFromPool(db.Pool)
	defer sdb.Close()
	require.NoError(t, migrations.Up(ctxT(t), sdb, migrations.WithLogger(quiet)))
	return db
}

// record records effects in a guarded transaction of l on db.
func record(t testing.TB, db *testenv.DB, l guard.Lease, effects ...outbox.Effect) {
	t.Helper()
	store, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	_, err = guard.Exec(ctxT(t), store, l, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.Add(ctx, tx, effects...)
	})
	require.NoError(t, err)
}

// fast are relay options for tests: short polls, timeouts and backoffs.
func fast(extra ...outbox.RelayOption) []outbox.RelayOption {
	return append([]outbox.RelayOption{
		outbox.WithPollInterval(20 * time.Millisecond),
		outbox.WithSendTimeout(500 * time.Millisecond), outbox.WithVisibilityTimeout(1500 * time.Millisecond),
		outbox.WithBackoff(50*time.Millisecond, 200*time.Millisecond), outbox.WithMaxAttempts(100),
	}, extra...)
}

// startRelay runs a relay of db's outbox through sender, with fast
// options, until the test ends.
func startRelay(t testing.TB, db *testenv.DB, sender outbox.Sender, extra ...outbox.RelayOption) *outbox.Relay {
	t.Helper()
	return outboxtest.StartRelay(t, db.Pool, sender, fast(extra...)...)
}

// drained waits until db's outbox has no live row (dead rows stay).
func drained(t testing.TB, db *testenv.DB) {
	t.Helper()
	require.Eventually(t, func() bool {
		var live int
		err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM fencelock.outbox WHERE dead_at IS NULL`).Scan(&live)
		return err == nil && live == 0
	}, 30*time.Second, 20*time.Millisecond, "the relay never delivered every effect")
}
