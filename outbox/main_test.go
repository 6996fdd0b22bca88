package outbox_test

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/outbox/outboxtest"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for migrations
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if outboxtest.IsRelayProcess() {
		os.Exit(outboxtest.RelayMain())
	}
	testenv.Main(m)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// migrate installs the fencelock schema into the database at url.
func migrate(t testing.TB, url string) {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, migrations.Up(ctxT(t), db, migrations.WithLogger(quiet)))
}

var quiet = outboxtest.Quiet

// newDB is a fresh database with the fencelock schema.
func newDB(t testing.TB) *testenv.DB {
	t.Helper()
	db := testenv.NewDB(t)
	migrate(t, db.URL)
	return db
}

// raw records effects the way a writer in another language does: claim,
// then outbox_add, in one transaction. It returns the commit's error.
func raw(ctx context.Context, pool *pgxpool.Pool, resource string, token int64, holder string, effects ...outbox.Effect) error {
	type row struct {
		D string              `json:"d"`
		K string              `json:"k"`
		P string              `json:"p"`
		H map[string][]string `json:"h,omitempty"`
		O bool                `json:"o,omitempty"`
	}
	rows := make([]row, len(effects))
	for i, e := range effects {
		rows[i] = row{D: e.Destination, K: e.Key, P: base64.StdEncoding.EncodeToString(e.Payload), H: e.Header, O: e.Ordered}
	}
	arg, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT fencelock.claim($1, $2, $3)`, resource, token, holder); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SELECT fencelock.outbox_add($1::jsonb)`, string(arg)); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// rows counts the outbox rows: all, and dead ones.
func rows(t testing.TB, pool *pgxpool.Pool) (all, dead int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(ctxT(t), `SELECT count(*), count(*) FILTER (WHERE dead_at IS NOT NULL) FROM fencelock.outbox`).Scan(&all, &dead))
	return all, dead
}

// receiver is an HTTP receiver that records what it gets and answers
// what answer says (200 when nil).
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	got    []got
	answer func(r *http.Request, n int) int // n: how many times this key came before
}

type got struct {
	key, resource, holder, token, body string
	header                             http.Header
	at                                 time.Time
}

func newReceiver(t testing.TB, answer func(r *http.Request, n int) int) *receiver {
	rc := &receiver{answer: answer}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		n := 0
		for _, g := range rc.got {
			if g.key == r.Header.Get("Idempotency-Key") {
				n++
			}
		}
		rc.got = append(rc.got, got{
			key: r.Header.Get("Idempotency-Key"), resource: r.Header.Get("Fencing-Resource"),
			holder: r.Header.Get("Fencing-Holder"), token: r.Header.Get("Fencing-Token"), body: string(body), header: r.Header.Clone(),
			at: time.Now(),
		})
		rc.mu.Unlock()
		code := http.StatusOK
		if rc.answer != nil {
			code = rc.answer(r, n)
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, http.StatusText(code))
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) deliveries() []got {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]got(nil), rc.got...)
}

// keys counts deliveries per key.
func (rc *receiver) keys() map[string]int {
	m := map[string]int{}
	for _, g := range rc.deliveries() {
		m[g.key]++
	}
	return m
}

// startRelay is outboxtest.StartRelay.
var startRelay = outboxtest.StartRelay

// eventually polls cond every 20ms for up to a minute.
func eventually(t testing.TB, cond func() bool, msg string, args ...any) {
	t.Helper()
	require.Eventually(t, cond, time.Minute, 20*time.Millisecond, append([]any{msg}, args...)...)
}

// httpSender is an HTTPSender with a transport of its own, closed at the
// end of the test (no idle connection outlives it).
func httpSender(t testing.TB) *outbox.HTTPSender {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &outbox.HTTPSender{Client: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}
