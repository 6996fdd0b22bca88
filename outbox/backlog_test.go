package outbox_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/outbox/outboxtest"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// backlogRows is the backlog of TestBacklogMillion (outboxtest.LoadBacklog):
// nine in ten unordered, one in ten ordered over 1,000 resources, every
// thousandth dead.
const backlogRows = 1_000_000

// With a backlog of a million due rows, the outbox's statements read a
// number of rows bounded by their limits, through indexes, never the
// table: the plans Postgres runs (EXPLAIN ANALYZE with BUFFERS, from
// auto_explain, those inside the functions included) show no sequential
// scan of fencelock.outbox. A claim walks outbox_due_idx for unordered
// rows and outbox_ordered_idx for the heads of ordered ones; Backlog four
// index ranges of at most its limit + 1 rows each; List of dead rows
// outbox_dead_idx, as many rows as it lists. And a relay working through
// the backlog holds what its batches hold, not the backlog: its heap
// stays within a few MiB.
func TestBacklogMillion(t *testing.T) {
	db := newDB(t)
	outboxtest.LoadBacklog(t, db.Pool, backlogRows)

	t.Run("claim", func(t *testing.T) { claimBounded(t, db) })
	t.Run("Backlog", func(t *testing.T) { backlogBounded(t, db.URL) })
	t.Run("List", func(t *testing.T) { listBounded(t, db.URL) })
	if t.Failed() {
		return
	}

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
	start := time.Now()
	r := startRelay(t, db.Pool, sender, outbox.WithBatchSize(100), outbox.WithConcurrency(100))
	eventually(t, func() bool { return r.Stats().Sent >= 10_000 }, "10,000 of the backlog delivered")
	t.Logf("10,000 delivered in %v", time.Since(start).Round(time.Millisecond))
	mu.Lock()
	grew := int64(peak.HeapInuse) - int64(before.HeapInuse)
	mu.Unlock()
	t.Logf("heap in use grew by %d KiB at most", grew/1024)
	assert.Less(t, grew, int64(32<<20), "the relay holds its batches, not the backlog")
}

// claimBounded: one outbox_claim of 2,000 rows takes the heads of the
// 1,000 ordered resources (the first pass) and 1,000 unordered rows.
func claimBounded(t *testing.T, db *testenv.DB) {
	const batch = 2000
	var ids []int64
	plans := outboxtest.Plans(t, db.URL, func(ctx context.Context, conn *pgx.Conn) {
		require.NoError(t, conn.QueryRow(ctx, `SELECT array_agg(id) FROM fencelock.outbox_claim(1, $1, interval '1 minute')`, batch).Scan(&ids))
	})
	require.Len(t, ids, batch)
	// The heads' loose scan probes the ordered index once per resource (twice
	// over: after and up to the last resource claimed), the update finds each
	// claimed row by its key.
	read := outboxtest.CheckBounded(t, plans, "outbox", 5*batch, "outbox_due_idx", "outbox_ordered_idx", "outbox_pkey")
	t.Logf("a claim of %d rows read %d rows of the outbox", batch, read)
	for _, p := range plans {
		t.Logf("%s", p)
	}
	_, err := db.Pool.Exec(ctxT(t), `SELECT fencelock.outbox_release(array_fill(1::bigint, array[cardinality($1::bigint[])]), $1)`, ids)
	require.NoError(t, err)
}

// backlogBounded: Backlog's four index ranges read at most limit + 1 rows
// each; what it counts in full (the dead rows) is exact, what it cuts
// short says so.
func backlogBounded(t *testing.T, url string) {
	const limit = outbox.DefaultBacklogLimit
	var c outbox.CappedCounts
	plans := outboxtest.Plans(t, url, func(ctx context.Context, conn *pgx.Conn) {
		var err error
		c, err = outbox.Backlog(ctx, conn, 0)
		require.NoError(t, err)
	})
	assert.Equal(t, outbox.CappedCounts{
		Counts: outbox.Counts{Due: limit, Dead: backlogRows / 1000}, Limit: limit,
		Capped: outbox.Capped{Due: true, Waiting: true, Claimed: true},
	}, c, "due rows past the limit, ordered rows past it (so waiting and claimed may be short), every dead row counted")
	read := outboxtest.CheckBounded(t, plans, "outbox", 4*(limit+1), "outbox_due_idx", "outbox_ordered_idx", "outbox_dead_idx")
	for _, p := range plans {
		t.Logf("%s", p)
	}
	call := plans[len(plans)-1]
	require.Equal(t, "Function Scan", call.Root.Type, call.Query)
	t.Logf("Backlog(%d) read %d rows of the outbox, %d pages (%d from disk)", limit, read, call.Root.SharedHit+call.Root.SharedRead, call.Root.SharedRead)
}

// listBounded: dead rows are listed through their index, one row read per
// row listed.
func listBounded(t *testing.T, url string) {
	var rows []outbox.Row
	plans := outboxtest.Plans(t, url, func(ctx context.Context, conn *pgx.Conn) {
		var err error
		rows, err = outbox.List(ctx, conn, true, 100)
		require.NoError(t, err)
	})
	require.Len(t, rows, 100)
	for i, r := range rows {
		require.NotNil(t, r.Dead, "row %d", r.ID)
		if i > 0 {
			require.Less(t, rows[i-1].ID, r.ID, "oldest first")
		}
	}
	for _, p := range plans {
		t.Logf("%s", p)
	}
	read := outboxtest.CheckBounded(t, plans, "outbox", 100, "outbox_dead_idx")
	t.Logf("List of 100 dead rows read %d rows of the outbox", read)
}
