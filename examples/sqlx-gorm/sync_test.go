package inventory_test

import (
	"context"
	"errors"
	"testing"

	inventory "github.com/fencelock/fencelock/examples/sqlx-gorm"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// syncer is what both workers offer.
type syncer interface {
	Sync(ctx context.Context, lease guard.Lease, b inventory.Batch) error
}

// The same story for both workers: worker a syncs batch-1; a late a
// (paused past its lease, then back) tries batch-2 after b took over and
// is refused by the database; b re-runs batch-1 after the takeover (it
// cannot know a applied it) and skips it; b writes batch-2.
func TestWorkers(t *testing.T) {
	for _, tc := range []struct {
		name string
		new  func(t *testing.T, url, worker string) syncer
	}{
		{"sqlx on lib/pq", func(t *testing.T, url, worker string) syncer {
			w, err := inventory.NewSQLXWorker(sqlx.NewDb(openDB(t, "postgres", url), "postgres"), worker)
			require.NoError(t, err)
			return w
		}},
		{"GORM on pgx", func(t *testing.T, url, worker string) syncer {
			g, err := gorm.Open(postgres.New(postgres.Config{Conn: openDB(t, "pgx", url)}), &gorm.Config{Logger: logger.Discard})
			require.NoError(t, err)
			w, err := inventory.NewGORMWorker(g, worker)
			require.NoError(t, err)
			return w
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := newDB(t)
			ctx := testCtx(t)
			check := openDB(t, "pgx", url)
			require.NoError(t, inventory.CreateSchema(ctx, check))
			rows := func(batch, writer string) (n int) {
				require.NoError(t, check.QueryRowContext(ctx, "SELECT count(*) FROM stock WHERE batch = $1 AND writer = $2", batch, writer).Scan(&n))
				return n
			}
			a, b := tc.new(t, url, "a"), tc.new(t, url, "b")
			batch1 := inventory.Batch{ID: "batch-1", Rows: []inventory.Row{{SKU: "A-1", Qty: 5}, {SKU: "A-2", Qty: 7}, {SKU: "B-9", Qty: 1}}}
			batch2 := inventory.Batch{ID: "batch-2", Rows: []inventory.Row{{SKU: "A-1", Qty: 4}}}
			la, lb := guardtest.Lease{Resource: "stock:eu", Tok: 1, Who: "a"}, guardtest.Lease{Resource: "stock:eu", Tok: 2, Who: "b"}

			// A batch is written once.
			require.NoError(t, a.Sync(ctx, la, batch1))
			assert.Equal(t, 3, rows("batch-1", "a"))
			err := a.Sync(ctx, la, batch1)
			require.ErrorIs(t, err, guard.ErrAlreadyApplied, "the same holder again")
			assert.Equal(t, 3, rows("batch-1", "a"), "written once")

			// b takes over; the late a is refused by the database.
			require.NoError(t, b.Sync(ctx, lb, inventory.Batch{ID: "batch-0", Rows: []inventory.Row{{SKU: "Z", Qty: 1}}}))
			err = a.Sync(ctx, la, batch2)
			var stale *guard.StaleTokenError
			require.ErrorAs(t, err, &stale, "a late holder is refused")
			assert.Equal(t, guard.StaleTokenError{Resource: "stock:eu", Token: 1, Current: 2}, *stale)
			assert.Equal(t, 0, rows("batch-2", "a"), "nothing of the late holder")

			// b re-runs batch-1: applied before, skipped.
			err = b.Sync(ctx, lb, batch1)
			require.True(t, errors.Is(err, guard.ErrAlreadyApplied), "an applied key is skipped: %v", err)
			assert.Equal(t, 0, rows("batch-1", "b"))
			require.NoError(t, b.Sync(ctx, lb, batch2))
			assert.Equal(t, 1, rows("batch-2", "b"))
		})
	}
}
