package pgfence_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An Exec cut short says that nothing was committed and that a retry
// with the same key is safe, once each, and the retry commits once: ctx
// ending while fn runs (it was a bare "context deadline exceeded"), and
// Postgres restarted while fn held its transaction open, so that the
// commit meets the server's "FATAL: terminating connection".
func TestInterruptedExecSaysNothingCommitted(t *testing.T) {
	check := func(t *testing.T, err error, key string) {
		t.Helper()
		require.Error(t, err)
		t.Log(err)
		assert.NotErrorIs(t, err, guard.ErrUnknownOutcome)
		msg := err.Error()
		assert.True(t, strings.HasPrefix(msg, "guard: interrupted"), msg)
		assert.Equal(t, 1, strings.Count(msg, "nothing was committed"), msg)
		assert.Contains(t, msg, `retrying with the same key ("`+key+`") is safe: `)
		assert.Equal(t, 1, strings.Count(msg, "guard: "), msg)
	}
	insert := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO stock (sku, qty, writer) VALUES ('x', 1, 'w')")
		return err
	}
	lease := guardtest.Lease{Resource: "cut", Tok: 1, Who: "a"}

	t.Run("ctx ends in fn", func(t *testing.T) {
		db := newDB(t)
		stockTable(t, db.Pool)
		store := newStore(t, db.Pool)
		ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
		defer cancel()
		_, err := guard.Exec(ctx, store, lease, func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT pg_sleep(60)")
			return err
		}, guard.WithKey("batch-1"))
		check(t, err, "batch-1")
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		_, err = guard.Exec(testCtx(t), store, lease, insert, guard.WithKey("batch-1"))
		require.NoError(t, err, "the retry")
		assert.EqualValues(t, 1, count(t, db.Pool, "SELECT count(*) FROM stock"))
	})

	t.Run("Postgres restarted during the commit", func(t *testing.T) {
		pg, err := testenv.StartPostgres()
		require.NoError(t, err)
		t.Cleanup(func() { _ = pg.Stop() })
		db := pg.NewDB(t)
		migrate(t, db.Pool)
		stockTable(t, db.Pool)
		store := newStore(t, db.Pool)
		ctx := testCtx(t)
		inFn, restarted := make(chan struct{}), make(chan struct{})
		go func() {
			<-inFn
			assert.NoError(t, pg.Restart())
			close(restarted)
		}()
		_, err = guard.Exec(ctx, store, lease, func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx); err != nil {
				return err
			}
			close(inFn)
			<-restarted // the server cut this transaction's connection meanwhile
			return nil
		}, guard.WithKey("batch-2"))
		check(t, err, "batch-2")
		require.Eventually(t, func() bool {
			_, err = guard.Exec(ctx, store, lease, insert, guard.WithKey("batch-2"))
			return err == nil
		}, time.Minute, 50*time.Millisecond, "the retry after the restart: %v", err)
		assert.EqualValues(t, 1, count(t, db.Pool, "SELECT count(*) FROM stock"))
	})
}
