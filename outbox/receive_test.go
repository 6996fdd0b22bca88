package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fencedReceiver is a receiver that applies deliveries to its own
// Postgres through outbox.Receive: a row per applied key.
func fencedReceiver(t testing.TB) (*httptest.Server, func() map[string]int) {
	srv, applied, _ := fencedReceiverDB(t)
	return srv, applied
}

// fencedReceiverDB is fencedReceiver with the receiver's database.
func fencedReceiverDB(t testing.TB) (*httptest.Server, func() map[string]int, *testenv.DB) {
	db := newDB(t)
	ctx := ctxT(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE applied_effects (key text, token bigint, body text)`)
	require.NoError(t, err)
	store, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	srv := httptest.NewServer(outbox.Receive(store, func(ctx context.Context, tx pgx.Tx, d outbox.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied_effects VALUES ($1, $2, $3)`, d.Key, d.Token, string(d.Payload))
		return err
	}))
	t.Cleanup(srv.Close)
	applied := func() map[string]int {
		rs, err := db.Pool.Query(ctx, `SELECT key, count(*) FROM applied_effects GROUP BY key`)
		require.NoError(t, err)
		m := map[string]int{}
		for rs.Next() {
			var k string
			var n int
			require.NoError(t, rs.Scan(&k, &n))
			m[k] = n
		}
		require.NoError(t, rs.Err())
		return m
	}
	return srv, applied, db
}

func post(t *testing.T, url string, h map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range h {
		req.Header.Set(k, v)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	lastOutcome = resp.Header.Get(outbox.HeaderFencingOutcome)
	return resp.StatusCode, string(b)
}

// lastOutcome is the Fencing-Outcome of post's last answer.
var lastOutcome string

// The receiver applies a delivery once: a redelivery is 200 without a
// second row; an older token than one applied is 409 and not applied; a
// request without the fencing headers is 400; a body over MaxPayload 413.
func TestReceive(t *testing.T) {
	srv, applied := fencedReceiver(t)
	h := func(key, token string) map[string]string {
		return map[string]string{"Idempotency-Key": key, "Fencing-Token": token, "Fencing-Resource": "stock:eu", "Fencing-Holder": "w1"}
	}
	code, _ := post(t, srv.URL, h("k1", "5"), "one")
	assert.Equal(t, http.StatusOK, code)
	assert.Empty(t, lastOutcome, "a first delivery carries no Fencing-Outcome")
	code, _ = post(t, srv.URL, h("k1", "5"), "one")
	assert.Equal(t, http.StatusOK, code, "redelivery")
	assert.Equal(t, "already_applied", lastOutcome, "a redelivery says so")
	code, _ = post(t, srv.URL, h("k2", "6"), "two")
	assert.Equal(t, http.StatusOK, code)
	code, body := post(t, srv.URL, h("k3", "5"), "late")
	assert.Equal(t, http.StatusConflict, code, "token 5 after 6")
	assert.Contains(t, body, "stale")
	assert.Empty(t, lastOutcome, "a 409 carries no Fencing-Outcome")

	code, body = post(t, srv.URL, map[string]string{"Idempotency-Key": "k4"}, "x")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "header Fencing-Resource missing")
	code, body = post(t, srv.URL, h("k5", "zero"), "x")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, `header Fencing-Token is "zero"`)
	code, _ = post(t, srv.URL, h("k6", "7"), strings.Repeat("x", outbox.MaxPayload+1))
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)

	assert.Equal(t, map[string]int{"k1": 1, "k2": 1}, applied())
}

func TestStatus(t *testing.T) {
	for err, want := range map[error]int{
		nil: 200, guard.ErrAlreadyApplied: 200, guard.ErrRunFinished: 200,
		&guard.StaleTokenError{Resource: "r", Token: 1, Current: 2}: 409,
		outbox.ErrBadDelivery: 400, outbox.Terminal(errors.New("no")): 422, errors.New("db down"): 503,
		fmt.Errorf("wrapped: %w", guard.ErrAlreadyApplied): 200,
	} {
		assert.Equal(t, want, outbox.Status(err), "%v", err)
	}
}

// A delivery whose apply finds its run finished (guard.ErrRunFinished: the
// receiver's work it belongs to is done) is answered 200 with
// Fencing-Outcome: already_applied, nothing written; the relay counts it
// already applied and deletes the row, as it does for a Sender of its own
// that returns the error.
func TestReceiveRunFinished(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	store, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `CREATE TABLE applied_effects (key text)`)
	require.NoError(t, err)
	srv := httptest.NewServer(outbox.Receive(store, func(ctx context.Context, tx pgx.Tx, d outbox.Delivery) error {
		if _, err := tx.Exec(ctx, `INSERT INTO applied_effects VALUES ($1)`, d.Key); err != nil {
			return err
		}
		return fmt.Errorf("step of %s: %w", d.Key, guard.ErrRunFinished)
	}))
	t.Cleanup(srv.Close)
	code, body := post(t, srv.URL, map[string]string{"Idempotency-Key": "k", "Fencing-Token": "1", "Fencing-Resource": "r", "Fencing-Holder": "h"}, "x")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "already_applied", lastOutcome)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM applied_effects`).Scan(&n))
	assert.Zero(t, n, "nothing written")

	finished := outbox.SenderFunc(func(context.Context, outbox.Delivery) error { return guard.ErrRunFinished })
	for name, sender := range map[string]outbox.Sender{"HTTPSender to Receive": httpSender(t), "a Sender of its own": finished} {
		t.Run(name, func(t *testing.T) { // its relay stops when it ends
			require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: srv.URL, Key: name}))
			r := startRelay(t, db.Pool, sender, outbox.WithPollInterval(10*time.Millisecond))
			eventually(t, func() bool { all, _ := rows(t, db.Pool); return all == 0 }, "the row deleted")
			assert.Equal(t, outbox.RelayStats{Claimed: 1, AlreadyApplied: 1}, r.Stats())
		})
	}
}

// HTTPSender: what each answer means to the relay, and the headers it
// sends.
func TestHTTPSender(t *testing.T) {
	var mu sync.Mutex
	var last *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		last = r.Clone(context.Background())
		mu.Unlock()
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(204)
		case "/again":
			w.Header().Set("Fencing-Outcome", "already_applied")
		case "/stale":
			http.Error(w, "token 3 is older than 9", http.StatusConflict)
		case "/bad":
			http.Error(w, "no such sku\nline two", http.StatusBadRequest)
		case "/slow":
			http.Error(w, "later", http.StatusTooManyRequests)
		case "/moved":
			http.Redirect(w, r, "/ok", http.StatusFound)
		default:
			http.Error(w, "oops", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	s := httpSender(t)
	d := outbox.Delivery{Resource: "stock:eu", Token: 42, Holder: "w1", Key: "k", Payload: []byte("{}"),
		Header: http.Header{"Content-Type": {"application/json"}}}
	send := func(path string) error {
		d := d
		d.Destination = srv.URL + path
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return s.Send(ctx, d)
	}
	require.NoError(t, send("/ok"))
	mu.Lock()
	assert.Equal(t, "k", last.Header.Get("Idempotency-Key"))
	assert.Equal(t, "42", last.Header.Get("Fencing-Token"))
	assert.Equal(t, "stock:eu", last.Header.Get("Fencing-Resource"))
	assert.Equal(t, "w1", last.Header.Get("Fencing-Holder"))
	assert.Equal(t, "application/json", last.Header.Get("Content-Type"))
	assert.Equal(t, http.MethodPost, last.Method)
	mu.Unlock()

	err := send("/again")
	require.ErrorIs(t, err, guard.ErrAlreadyApplied, "a 2xx with Fencing-Outcome: already_applied")
	assert.Contains(t, err.Error(), "200 OK")
	err = send("/stale")
	require.ErrorIs(t, err, outbox.ErrSuperseded)
	assert.Contains(t, err.Error(), "409 Conflict: token 3 is older than 9")
	err = send("/bad")
	require.ErrorIs(t, err, outbox.ErrTerminal)
	assert.Contains(t, err.Error(), "400 Bad Request: no such sku line two")
	err = send("/moved")
	require.ErrorIs(t, err, outbox.ErrTerminal, "a redirect is not followed")
	for _, p := range []string{"/slow", "/boom"} {
		err = send(p)
		require.Error(t, err)
		assert.False(t, errors.Is(err, outbox.ErrTerminal) || errors.Is(err, outbox.ErrSuperseded), "%s is retried: %v", p, err)
	}
	d.Destination = "ftp://example.com/x"
	require.ErrorIs(t, s.Send(context.Background(), d), outbox.ErrTerminal)
	d.Destination = "http://127.0.0.1:1/nothing-listens"
	err = s.Send(context.Background(), d)
	require.Error(t, err)
	assert.False(t, errors.Is(err, outbox.ErrTerminal), "a network error is retried")
	assert.Contains(t, err.Error(), "connection refused")
}

// ReadHeaders turns the relay's headers back into the lease.
func TestReadHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("Idempotency-Key", "k")
	h.Set("Fencing-Token", "7")
	h.Set("Fencing-Resource", "r")
	h.Set("Fencing-Holder", "h")
	l, key, err := outbox.ReadHeaders(h)
	require.NoError(t, err)
	assert.Equal(t, []any{"r", int64(7), "h", "k"}, []any{l.Name(), l.Token(), l.Holder(), key})
	h.Add("Fencing-Token", "8")
	_, _, err = outbox.ReadHeaders(h)
	require.ErrorIs(t, err, outbox.ErrBadDelivery)
	assert.Contains(t, err.Error(), "given 2 times")
	h.Set("Fencing-Token", "-1")
	_, _, err = outbox.ReadHeaders(h)
	require.ErrorIs(t, err, outbox.ErrBadDelivery)
	h.Set("Fencing-Token", "1")
	h.Set("Idempotency-Key", string(bytes.Repeat([]byte("k"), outbox.MaxKeyLen+1)))
	_, _, err = outbox.ReadHeaders(h)
	require.ErrorIs(t, err, outbox.ErrBadDelivery)
}
