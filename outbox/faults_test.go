package outbox_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Behind PgBouncer in transaction mode, with pgx's default exec mode on
// the relay's pool: polling delivers everything.
func TestRelayBehindPgBouncer(t *testing.T) {
	db := testenv.NewDBViaPgBouncer(t)
	migrate(t, db.DirectURL)
	ctx := ctxT(t)
	direct, err := pgxpool.New(ctx, db.DirectURL)
	require.NoError(t, err)
	defer direct.Close()
	rc := newReceiver(t, nil)
	startRelay(t, db.Pool, httpSender(t), outbox.WithPollInterval(20*time.Millisecond))
	for i := range 40 {
		require.NoError(t, raw(ctx, direct, "r", int64(i+1), "h", outbox.Effect{Destination: rc.URL, Key: fmt.Sprint(i)}))
	}
	eventually(t, func() bool { all, _ := rows(t, direct); return all == 0 }, "all delivered through PgBouncer")
	assert.Len(t, rc.keys(), 40)
}

// Postgres restarted under a running relay (connections cut): the relay
// waits it through and delivers what was recorded before and after, and
// its LISTEN connection comes back too: with a poll interval of an hour,
// an effect added with NOTIFY after the restart is delivered at once.
func TestRelayPostgresRestart(t *testing.T) {
	pg, err := testenv.StartPostgres()
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })
	db := pg.NewDB(t)
	migrate(t, db.URL)
	ctx := ctxT(t)
	rc := newReceiver(t, nil)
	r := startRelay(t, db.Pool, httpSender(t), outbox.WithListen(), outbox.WithPollInterval(time.Hour))
	require.NoError(t, rawNotify(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: rc.URL, Key: "before"}))
	eventually(t, func() bool { return rc.keys()["before"] == 1 }, "delivered on NOTIFY")

	require.NoError(t, pg.Restart())
	require.Eventually(t, func() bool {
		return rawNotify(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: rc.URL, Key: "after"}) == nil
	}, time.Minute, 50*time.Millisecond, "write after the restart")
	eventually(t, func() bool { return rc.keys()["after"] == 1 }, "delivered after the restart, on NOTIFY")
	// The relay counts a delivery when its loop takes Send's result, after
	// the receiver has answered: wait for the count, then for the row to be
	// gone, and check that nothing was sent twice.
	eventually(t, func() bool { return r.Stats().Sent == 2 }, "both deliveries counted")
	eventually(t, func() bool { all, _ := rows(t, db.Pool); return all == 0 }, "both rows deleted")
	assert.EqualValues(t, 2, r.Stats().Sent)
	assert.Equal(t, map[string]int{"before": 1, "after": 1}, rc.keys())
}

// A read-only database: the relay claims nothing (so sends nothing), keeps
// running, and delivers once the database is writable again.
func TestRelayReadOnlyDatabase(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	rc := newReceiver(t, nil)
	require.NoError(t, raw(ctx, db.Pool, "r", 1, "h", outbox.Effect{Destination: rc.URL, Key: "k"}))
	setReadOnly := func(on bool) {
		tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadWrite})
		require.NoError(t, err)
		_, err = tx.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %q SET default_transaction_read_only = %t`, db.Name, on))
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		db.Pool.Reset() // new sessions read the setting
	}
	setReadOnly(true)
	var logs syncBuf
	r := startRelay(t, db.Pool, httpSender(t), outbox.WithPollInterval(10*time.Millisecond),
		outbox.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	eventually(t, func() bool { return strings.Contains(logs.String(), "the database is read-only") }, "the relay says why it claims nothing")
	assert.Empty(t, rc.keys(), "nothing sent from a read-only database")
	assert.Zero(t, r.Stats().Claimed)
	setReadOnly(false)
	eventually(t, func() bool { return rc.keys()["k"] == 1 }, "delivered once writable")
}

// rawNotify is raw with outbox_add's NOTIFY.
func rawNotify(ctx context.Context, pool *pgxpool.Pool, resource string, token int64, holder string, e outbox.Effect) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT fencelock.claim($1, $2, $3)`, resource, token, holder); err != nil {
		return err
	}
	arg := fmt.Sprintf(`[{"d": %q, "k": %q}]`, e.Destination, e.Key)
	if _, err := tx.Exec(ctx, `SELECT fencelock.outbox_add($1::jsonb, true)`, arg); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// syncBuf is a buffer safe for a logger and a test to share.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
