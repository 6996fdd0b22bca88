package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/outbox"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A raw insert into the outbox, or outbox_add, without a current fence
// claim in the transaction is refused (FL002): only a fenced transaction
// records effects.
func TestInsertWithoutClaimRefused(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	for _, q := range []string{
		`INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload) VALUES ('r', 1, 'h', 'd', 'k', '')`,
		`SELECT fencelock.outbox_add('[{"d":"x","k":"k"}]')`,
	} {
		_, err := db.Pool.Exec(ctx, q)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, q)
		assert.Equal(t, "FL002", pgErr.Code, q)
	}
	// A stale claim rolls its effects back with it.
	require.NoError(t, raw(ctx, db.Pool, "r", 5, "a", outbox.Effect{Destination: "x", Key: "k5"}))
	err := raw(ctx, db.Pool, "r", 4, "b", outbox.Effect{Destination: "x", Key: "k4"})
	require.ErrorContains(t, err, "FL001")
	all, _ := rows(t, db.Pool)
	assert.Equal(t, 1, all)
	var token int64
	var holder, resource string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT resource, token, holder FROM fencelock.outbox`).Scan(&resource, &token, &holder))
	assert.Equal(t, []any{"r", int64(5), "a"}, []any{resource, token, holder}, "the claim's fence, from the transaction's settings")
}

// Every effect arrives once at the receiver with its payload, its headers
// and the four the relay sets, and its row is deleted.
func TestRelayDelivers(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	rc := newReceiver(t, nil)
	const n = 50
	for i := range n {
		require.NoError(t, raw(ctx, db.Pool, "stock:eu", int64(100+i), "worker-1", outbox.Effect{
			Destination: rc.URL + "/stock", Key: "k" + strconv.Itoa(i), Payload: []byte("payload " + strconv.Itoa(i)),
			Header: http.Header{"Content-Type": {"application/json"}, "X-Batch": {strconv.Itoa(i)}},
		}))
	}
	r := startRelay(t, db.Pool, httpSender(t))
	eventually(t, func() bool { all, _ := rows(t, db.Pool); return all == 0 }, "every row delivered and deleted")
	keys := rc.keys()
	require.Len(t, keys, n)
	for k, c := range keys {
		assert.Equal(t, 1, c, k)
	}
	for _, g := range rc.deliveries() {
		i, err := strconv.Atoi(g.key[1:])
		require.NoError(t, err)
		assert.Equal(t, "payload "+strconv.Itoa(i), g.body)
		assert.Equal(t, "stock:eu", g.resource)
		assert.Equal(t, "worker-1", g.holder)
		assert.Equal(t, strconv.Itoa(100+i), g.token)
		assert.Equal(t, "application/json", g.header.Get("Content-Type"))
		assert.Equal(t, strconv.Itoa(i), g.header.Get("X-Batch"))
	}
	st := r.Stats()
	assert.EqualValues(t, n, st.Sent)
	assert.EqualValues(t, n, st.Claimed)
}

// A 5xx is retried with backoff until it succeeds; a 4xx other than 409 is
// dead at once with the answer kept; a 409 deletes the row; running out of
// attempts is dead too. Requeued dead rows are delivered.
func TestRelayRetryDeadSupersededRequeue(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	var broken atomic.Bool
	broken.Store(true)
	rc := newReceiver(t, func(r *http.Request, n int) int {
		switch key := r.Header.Get("Idempotency-Key"); {
		case key == "flaky" && n < 2:
			return http.StatusServiceUnavailable
		case key == "bad" && broken.Load():
			return http.StatusUnprocessableEntity
		case key == "stale":
			return http.StatusConflict
		case key == "down" && broken.Load():
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	for _, k := range []string{"flaky", "bad", "stale", "down"} {
		require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: rc.URL, Key: k}))
	}
	r := startRelay(t, db.Pool, httpSender(t), outbox.WithBackoff(10*time.Millisecond, 50*time.Millisecond),
		outbox.WithMaxAttempts(4), outbox.WithPollInterval(10*time.Millisecond))
	eventually(t, func() bool { all, dead := rows(t, db.Pool); return all == 2 && dead == 2 }, "flaky and stale gone, bad and down dead")
	keys := rc.keys()
	assert.Equal(t, 3, keys["flaky"], "two 503s, then delivered")
	assert.Equal(t, 1, keys["bad"], "a 422 is not retried")
	assert.Equal(t, 1, keys["stale"], "a 409 is not retried")
	assert.Equal(t, 4, keys["down"], "max attempts")

	var lastErr string
	var attempts int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT last_error, attempts FROM fencelock.outbox WHERE key = 'bad'`).Scan(&lastErr, &attempts))
	assert.Contains(t, lastErr, "422 Unprocessable Entity")
	assert.Equal(t, 1, attempts)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT last_error FROM fencelock.outbox WHERE key = 'down'`).Scan(&lastErr))
	assert.Contains(t, lastErr, "500 Internal Server Error")
	st := r.Stats()
	assert.EqualValues(t, 1, st.Superseded)
	assert.EqualValues(t, 2, st.Dead)
	assert.EqualValues(t, 2+3, st.Failed, "flaky twice, down three times before its last attempt")

	// Fixed receiver, rows requeued: delivered.
	broken.Store(false)
	n, err := outbox.Requeue(ctx, db.Pool, nil)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	r.Wake()
	eventually(t, func() bool { all, _ := rows(t, db.Pool); return all == 0 }, "requeued rows delivered")
	keys = rc.keys()
	assert.Equal(t, 2, keys["bad"])
	assert.Equal(t, 5, keys["down"])
}

// A Sender that panics, one that hangs past the send timeout ignoring its
// context, and one that returns garbage errors: each is a failed attempt,
// and the relay goes on delivering the rest.
func TestRelaySurvivesBadSender(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	release := make(chan struct{})
	var mu sync.Mutex
	sent := map[string]int{}
	sender := outbox.SenderFunc(func(ctx context.Context, d outbox.Delivery) error {
		mu.Lock()
		sent[d.Key]++
		first := sent[d.Key] == 1
		mu.Unlock()
		switch {
		case d.Key == "panic" && first:
			panic("boom")
		case d.Key == "hang" && first:
			<-release // ignores ctx
			return nil
		case d.Key == "garbage" && first:
			var e *pgconn.PgError // a typed nil pointer inside an interface
			return fmt.Errorf("garbage: %w", error(e))
		}
		return nil
	})
	for _, k := range []string{"panic", "hang", "garbage", "fine"} {
		require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: "anywhere", Key: k}))
	}
	r := startRelay(t, db.Pool, sender, outbox.WithSendTimeout(200*time.Millisecond), outbox.WithVisibilityTimeout(2*time.Second),
		outbox.WithBackoff(10*time.Millisecond, 10*time.Millisecond), outbox.WithPollInterval(10*time.Millisecond))
	defer close(release)
	eventually(t, func() bool { all, _ := rows(t, db.Pool); return all == 0 }, "every row delivered on a later attempt")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]int{"panic": 2, "hang": 2, "garbage": 2, "fine": 1}, sent)
	assert.EqualValues(t, 3, r.Stats().Failed)
}

// An ack names its claim: a relay whose claim expired and was taken by
// another changes nothing, and the row is the new claim's.
func TestAckOnlyOwnClaim(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: "x", Key: "k"}))
	claim := func(c int64) []int64 {
		rs, err := db.Pool.Query(ctx, `SELECT id FROM fencelock.outbox_claim($1, 10, interval '1 millisecond')`, c)
		require.NoError(t, err)
		var ids []int64
		for rs.Next() {
			var id int64
			require.NoError(t, rs.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rs.Err())
		return ids
	}
	ids := claim(1)
	require.Len(t, ids, 1)
	time.Sleep(5 * time.Millisecond)
	require.Equal(t, ids, claim(2), "claimed again once the first claim's visibility passed")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT fencelock.outbox_ack('{1}', $1)`, ids).Scan(&n))
	assert.Zero(t, n, "the first claim's ack")
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT fencelock.outbox_retry('{1}', $1, '{x}', '{0}', '{true}')`, ids).Scan(&n))
	assert.Zero(t, n, "the first claim's retry")
	var attempts int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT attempts FROM fencelock.outbox`).Scan(&attempts))
	assert.Equal(t, 2, attempts)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT fencelock.outbox_ack('{2}', $1)`, ids).Scan(&n))
	assert.Equal(t, 1, n, "the second claim's ack")
}

// Two relays on one database share the work: every effect is delivered,
// none twice (no relay died, no send overran).
func TestTwoRelays(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	rc := newReceiver(t, nil)
	a := startRelay(t, db.Pool, httpSender(t), outbox.WithBatchSize(8), outbox.WithPollInterval(5*time.Millisecond))
	b := startRelay(t, db.Pool, httpSender(t), outbox.WithBatchSize(8), outbox.WithPollInterval(5*time.Millisecond))
	const writers, each = 4, 100
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				e := outbox.Effect{Destination: rc.URL, Key: fmt.Sprintf("w%d-%d", w, i)}
				if err := raw(ctx, db.Pool, fmt.Sprintf("r%d", w), 1, "h", e); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	eventually(t, func() bool { all, _ := rows(t, db.Pool); return all == 0 }, "all delivered")
	keys := rc.keys()
	assert.Len(t, keys, writers*each)
	for k, c := range keys {
		assert.Equal(t, 1, c, k)
	}
	sa, sb := a.Stats(), b.Stats()
	assert.EqualValues(t, writers*each, sa.Sent+sb.Sent)
	t.Logf("relay a sent %d, relay b %d", sa.Sent, sb.Sent)
}

func TestNewRelayBadInput(t *testing.T) {
	db := newDB(t)
	s := outbox.SenderFunc(func(context.Context, outbox.Delivery) error { return nil })
	_, err := outbox.NewRelay(nil, s)
	require.ErrorIs(t, err, outbox.ErrNilDB)
	_, err = outbox.NewRelay(db.Pool, nil)
	require.ErrorIs(t, err, outbox.ErrNilSender)
	for _, o := range []outbox.RelayOption{
		nil, outbox.WithBatchSize(0), outbox.WithConcurrency(-1), outbox.WithPollInterval(0), outbox.WithSendTimeout(0),
		outbox.WithVisibilityTimeout(5 * time.Second), // below the default send timeout + 1s
		outbox.WithMaxAttempts(0), outbox.WithBackoff(time.Second, time.Millisecond), outbox.WithLogger(nil),
	} {
		_, err := outbox.NewRelay(db.Pool, s, o)
		require.ErrorIs(t, err, outbox.ErrInvalidOption)
	}
	conn, err := db.Pool.Acquire(ctxT(t))
	require.NoError(t, err)
	defer conn.Release()
	_, err = outbox.NewRelay(conn.Conn(), s, outbox.WithListen())
	require.ErrorIs(t, err, outbox.ErrInvalidOption)
	assert.Contains(t, err.Error(), "*pgxpool.Pool")

	r, err := outbox.NewRelay(db.Pool, s)
	require.NoError(t, err)
	// 19 attempts after the first, each up to 30s visible + 100ms poll,
	// and backoffs 1, 2, ... 256s, then 300s ten times.
	want := 19*(30*time.Second+100*time.Millisecond) + (511+10*300)*time.Second
	assert.Equal(t, want, r.MaxRedeliveryDelay())
}

// A database whose schema is older than this fencelock, one without the
// schema, one whose outbox was dropped by hand at the current version,
// and a role without EXECUTE on the outbox's functions: Run says so at
// once, under the outbox's prefix alone, with the stores' error
// (errors.Is guard.ErrSchemaMissing) and a fix that names the database or
// the role.
func TestRelayNeedsSchema(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	noop := outbox.SenderFunc(func(context.Context, outbox.Delivery) error { return nil })

	// Roles with the documented grants less USAGE, or less EXECUTE: Run
	// returns at once, saying which and the statements the owner runs in
	// this database; run as printed, they let the relay run.
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	owner := u.User.Username()
	for _, tc := range []struct {
		skip  int
		lacks string
		fix   []string
	}{
		{0, "USAGE on schema fencelock, so it cannot run", []string{"GRANT USAGE ON SCHEMA fencelock TO %[1]s", "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO %[1]s", "ALTER DEFAULT PRIVILEGES FOR ROLE %[2]s IN SCHEMA fencelock GRANT EXECUTE ON FUNCTIONS TO %[1]s"}},
		{1, "EXECUTE on the outbox's functions (fencelock.outbox_claim and others), so it cannot run", []string{"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO %[1]s", "ALTER DEFAULT PRIVILEGES FOR ROLE %[2]s IN SCHEMA fencelock GRANT EXECUTE ON FUNCTIONS TO %[1]s"}},
	} {
		role := "fl_relay_" + strconv.Itoa(tc.skip) + "_" + strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
		_, err := db.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN NOSUPERUSER NOINHERIT`)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role)
			_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+role)
		})
		for i, g := range msgtest.AppGrants {
			if i != tc.skip {
				_, err := db.Pool.Exec(ctx, fmt.Sprintf(g, role, owner))
				require.NoError(t, err)
			}
		}
		au := *u
		au.User = url.User(role)
		app, err := pgxpool.New(ctx, au.String())
		require.NoError(t, err)
		t.Cleanup(app.Close)
		r, err := outbox.NewRelay(app, noop, outbox.WithLogger(quiet))
		require.NoError(t, err)
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = r.Run(rctx) // returns at once; without its error, at the timeout with nil
		cancel()
		require.Error(t, err, "Run waited instead of saying what the role lacks")
		assert.ErrorIs(t, err, guard.ErrPermission)
		var stmts []string
		for _, f := range tc.fix {
			stmts = append(stmts, fmt.Sprintf(f, role, owner))
		}
		assert.Equal(t, fmt.Sprintf(`outbox: relay: role %q lacks %s: as the schema's owner (role %q), run in database %q: psql -U %s -d %s -c '%s;'`,
			role, tc.lacks, owner, db.Name, owner, db.Name, strings.Join(stmts, "; ")), err.Error())
		fix := msgtest.ParsePsql(t, err.Error())
		for _, stmt := range fix.SQL {
			_, err := db.Pool.Exec(ctx, stmt)
			require.NoError(t, err, stmt)
		}
		// Now Run passes its check and runs until stopped (a refusal
		// would come back at once, not at the stop).
		rctx, cancel = context.WithTimeout(ctx, time.Second)
		require.NoError(t, r.Run(rctx), "after the fix %s", fix)
		cancel()
	}

	_, err = db.Pool.Exec(ctx, `ALTER FUNCTION fencelock.outbox_claim(bigint, integer, interval, text) RENAME TO outbox_claim_gone`)
	require.NoError(t, err)
	r, err := outbox.NewRelay(db.Pool, noop, outbox.WithLogger(quiet))
	require.NoError(t, err)
	err = r.Run(ctx)
	require.Error(t, err)
	assert.ErrorIs(t, err, guard.ErrSchemaMissing)
	assert.Equal(t, `outbox: schema fencelock in database "`+db.Name+`" is at version 5 but has no function fencelock.outbox_claim (changed by hand): restore it as migrations/00003_outbox.sql defines it, as the schema's owner, role "`+owner+`"`, err.Error())
	_, err = db.Pool.Exec(ctx, `ALTER FUNCTION fencelock.outbox_claim_gone(bigint, integer, interval, text) RENAME TO outbox_claim`)
	require.NoError(t, err)

	_, err = db.Pool.Exec(ctx, `CREATE OR REPLACE FUNCTION fencelock.schema_version() RETURNS bigint LANGUAGE sql AS $$ SELECT 2::bigint $$`)
	require.NoError(t, err)
	err = r.Run(ctx)
	require.Error(t, err)
	assert.ErrorIs(t, err, guard.ErrSchemaOutdated)
	assert.Contains(t, err.Error(), `outbox: fencelock schema out of date: schema fencelock in database "`+db.Name+`" is at version 2 and this fencelock needs`)
	assert.Contains(t, err.Error(), "run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db 'postgres://")
	assert.NotContains(t, err.Error(), "guard:", "one prefix")

	_, err = db.Pool.Exec(ctx, `DROP SCHEMA fencelock CASCADE`)
	require.NoError(t, err)
	err = r.Run(ctx)
	require.Error(t, err)
	assert.ErrorIs(t, err, guard.ErrSchemaMissing)
	assert.Contains(t, err.Error(), `outbox: fencelock schema not installed in database "`+db.Name+`"`)
	assert.NotContains(t, err.Error(), "guard:", "one prefix")
	_, err = outbox.List(ctx, db.Pool, true, 10)
	assert.ErrorIs(t, err, guard.ErrSchemaMissing)
	assert.Contains(t, err.Error(), `outbox: list: fencelock schema not installed in database "`+db.Name+`"`)
}

// errorEvents is an ErrorObserver that keeps what it gets.
type errorEvents struct {
	mu  sync.Mutex
	evs []outbox.ErrorEvent
}

func (o *errorEvents) OnRelayError(_ context.Context, e outbox.ErrorEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.evs = append(o.evs, e)
}

// denied counts the events that match guard.ErrPermission, and returns the
// last one's error.
func (o *errorEvents) denied() (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n, last := 0, error(nil)
	for _, e := range o.evs {
		if errors.Is(e.Err, guard.ErrPermission) {
			n, last = n+1, e.Err
		}
	}
	return n, last
}

// A relay whose role loses a grant after start-up (a REVOKE) does not end
// Run, and does not retry in silence: it logs the refusal at Error, worded
// as at start-up (the role, what it lacks, the GRANT the owner runs in the
// database named), once per change however many claims fail, reports
// every failure to the observers, and keeps polling, so that it delivers,
// without a restart, once the fix printed is run. Effects recorded
// meanwhile wait in the outbox.
func TestRelayLosesGrant(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	role, roleURL := msgtest.NewAppRole(t, db)
	app, err := pgxpool.New(ctx, roleURL)
	require.NoError(t, err)
	t.Cleanup(app.Close)
	rc := newReceiver(t, nil)
	var logs syncBuf
	obs := &errorEvents{}
	r, err := outbox.NewRelay(app, httpSender(t), outbox.WithPollInterval(10*time.Millisecond), outbox.WithObserver(obs),
		outbox.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: rc.URL, Key: "before"}))
	eventually(t, func() bool { return rc.keys()["before"] == 1 }, "delivered while granted")

	// Every outcome recorded first: the refusals to come are the claims'.
	allAcked := func() bool { return len(outboxRows(t, db, "true")) == 0 }
	eventually(t, allAcked, "the delivery recorded")

	for i, tc := range []struct{ revoke, lacks, grants string }{
		{"REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock FROM %[1]s", "EXECUTE on function fencelock.outbox_claim",
			"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO %[1]s; ALTER DEFAULT PRIVILEGES FOR ROLE postgres IN SCHEMA fencelock GRANT EXECUTE ON FUNCTIONS TO %[1]s"},
		{"REVOKE USAGE ON SCHEMA fencelock FROM %[1]s", "USAGE on schema fencelock",
			"GRANT USAGE ON SCHEMA fencelock TO %[1]s; GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO %[1]s; ALTER DEFAULT PRIVILEGES FOR ROLE postgres IN SCHEMA fencelock GRANT EXECUTE ON FUNCTIONS TO %[1]s"},
	} {
		seen, _ := obs.denied()
		_, err := db.Pool.Exec(ctx, fmt.Sprintf(tc.revoke, role))
		require.NoError(t, err)
		key := "revoked-" + strconv.Itoa(i)
		require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: rc.URL, Key: key}))
		// Several claims refused, each reported; the polls go on.
		eventually(t, func() bool { n, _ := obs.denied(); return n >= seen+5 }, "the refusals reported to the observers")
		_, last := obs.denied()
		want := fmt.Sprintf(`outbox: relay: role %q lacks %s, so it cannot claim: effects wait in the outbox, and the relay polls until the grant is back:`+
			` as the schema's owner (role "postgres"), run in database %q: psql -U postgres -d %s -c '%s;'`, role, tc.lacks, db.Name, db.Name, fmt.Sprintf(tc.grants, role))
		assert.Equal(t, want, last.Error())
		assert.Equal(t, i+1, strings.Count(logs.String(), "level=ERROR"), "logged once per change: %s", logs.String())
		assert.Equal(t, 1, strings.Count(logs.String(), strconv.Quote(want)), "the log line has the worded error: %s", logs.String())
		assert.NotContains(t, logs.String(), "relay cannot claim; retrying", "never the raw refusal, as for a database that is down")
		select {
		case err := <-done:
			t.Fatalf("Run returned while the grant was missing: %v", err)
		default:
		}
		assert.Zero(t, rc.keys()[key], "nothing claimed while refused")

		fix := msgtest.ParsePsql(t, last.Error())
		fix.Run(t, db.URL)
		eventually(t, func() bool { return rc.keys()[key] == 1 }, "delivered once %s ran, without a restart", fix)
		eventually(t, allAcked, "the delivery recorded")
		eventually(t, func() bool { return strings.Count(logs.String(), "relay reaches the database again") == i+1 }, "the recovery logged")
	}
	stop()
	require.NoError(t, <-done)
}

// A dead row's warning names its destination without the password, as
// RedactDestination writes it (and package fencelockotel's spans).
func TestRelayDeadWarningRedacts(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	const dest = "https://svc:s3cret@shop.example/stock"
	require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: dest, Key: "k"}))
	var logs syncBuf
	startRelay(t, db.Pool, outbox.SenderFunc(func(context.Context, outbox.Delivery) error { return outbox.Terminal(nil) }),
		outbox.WithPollInterval(10*time.Millisecond), outbox.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	eventually(t, func() bool { return strings.Contains(logs.String(), "row marked dead") }, "the dead row's warning")
	assert.Contains(t, logs.String(), "destination=https://svc:xxxxx@shop.example/stock")
	assert.NotContains(t, logs.String(), "s3cret")

	for in, want := range map[string]string{
		dest:                        "https://svc:xxxxx@shop.example/stock",
		"https://svc@shop.example/": "https://svc@shop.example/",
		"nats://stock.eu":           "nats://stock.eu",
		"not a url: %zz":            "not a url: %zz",
	} {
		assert.Equal(t, want, outbox.RedactDestination(in), in)
	}
}
