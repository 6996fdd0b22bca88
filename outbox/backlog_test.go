package outbox_test

import (
	"context"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// backlogRows is the backlog of TestBacklogMillion: nine in ten unordered,
// one in ten ordered over 1,000 resources.
const backlogRows = 1_000_000

// With a backlog of a million due rows, a claim walks indexes, never the
// table: the plans Postgres runs inside outbox_claim (read back with
// auto_explain) use outbox_due_idx for unordered rows and
// outbox_ordered_idx for the heads of ordered ones, with no sequential
// scan of the outbox. And a relay working through the backlog holds what
// its batches hold, not the backlog: its heap stays within a few MiB.
func TestBacklogMillion(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	start := time.Now()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	// One transaction writes rows of 1,000 resources, so not all of them
	// carry its claim: the bulk load goes past the outbox's trigger (a
	// superuser's replica mode), which this test is not about.
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `
INSERT INTO fencelock.outbox (resource, token, holder, destination, key, payload, ordered)
SELECT CASE WHEN g % 10 = 0 THEN 'res' || (g % 1000) ELSE 'r' END, 1, 'h', 'http://x', 'k' || g, '\x00', g % 10 = 0
  FROM generate_series(1, $1) g`, backlogRows)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	_, err = db.Pool.Exec(ctx, `ANALYZE fencelock.outbox`)
	require.NoError(t, err)
	t.Logf("backlog of %d rows written in %v", backlogRows, time.Since(start).Round(time.Millisecond))

	plans := claimPlans(t, db.URL)
	t.Logf("plans inside outbox_claim:\n%s", plans)
	assert.Regexp(t, `Index Scan using outbox_due_idx on outbox`, plans)
	assert.Regexp(t, `Index Scan using outbox_ordered_idx on outbox`, plans)
	assert.NotRegexp(t, regexp.MustCompile(`Seq Scan on outbox`), plans)

	// A relay with a no-op sender through 100 batches of the backlog.
	var sent atomic.Int64
	runtime.GC()
	var before, peak runtime.MemStats
	runtime.ReadMemStats(&before)
	var mu sync.Mutex
	sender := outbox.SenderFunc(func(context.Context, outbox.Delivery) error {
		if sent.Add(1)%1000 == 0 {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			mu.Lock()
			if m.HeapInuse > peak.HeapInuse {
				peak = m
			}
			mu.Unlock()
		}
		return nil
	})
	start = time.Now()
	r := startRelay(t, db.Pool, sender, outbox.WithBatchSize(100), outbox.WithConcurrency(100))
	eventually(t, func() bool { return r.Stats().Sent >= 10_000 }, "10,000 of the backlog delivered")
	t.Logf("10,000 delivered in %v", time.Since(start).Round(time.Millisecond))
	mu.Lock()
	grew := int64(peak.HeapInuse) - int64(before.HeapInuse)
	mu.Unlock()
	t.Logf("heap in use grew by %d KiB at most", grew/1024)
	assert.Less(t, grew, int64(32<<20), "the relay holds its batches, not the backlog")
}

// claimPlans runs one outbox_claim with auto_explain on and returns the
// plans of the statements it ran.
func claimPlans(t *testing.T, url string) string {
	t.Helper()
	ctx := ctxT(t)
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	var mu sync.Mutex
	var b strings.Builder
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		b.WriteString(n.Message + "\n")
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []string{
		`LOAD 'auto_explain'`, `SET auto_explain.log_min_duration = 0`, `SET auto_explain.log_nested_statements = on`,
		`SET auto_explain.log_level = notice`, `SET client_min_messages = notice`,
	} {
		_, err := conn.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	// A batch of 2,000: the first pass takes the heads of the 1,000
	// ordered resources, the unordered pass the rest.
	var ids []int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT array_agg(id) FROM fencelock.outbox_claim(1, 2000, interval '1 minute')`).Scan(&ids))
	require.Len(t, ids, 2000)
	mu.Lock()
	plans := b.String()
	mu.Unlock()
	_, err = conn.Exec(ctx, `SET auto_explain.log_min_duration = -1`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT fencelock.outbox_release(array_fill(1::bigint, array[cardinality($1::bigint[])]), $1)`, ids)
	require.NoError(t, err)
	return plans
}
