package pgfence_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestResumableRun(t *testing.T) {
	onBothPaths(t, func(t *testing.T, db *testenv.DB, pool *pgxpool.Pool) {
		stockTable(t, db.Pool)
		s := newStore(t, pool)
		ctx := testCtx(t)

		a := s.Run(guardtest.Lease{Resource: "sync", Tok: 1, Who: "a"}, "2026-11-30")
		cur, fin, err := a.Resume(ctx)
		require.NoError(t, err)
		assert.Equal(t, "", cur)
		assert.False(t, fin)

		require.NoError(t, a.Step(ctx, "page-1", insertStock("a", 1)))
		require.NoError(t, a.Step(ctx, "page-2", insertStock("a", 1)))
		cur, fin, err = a.Resume(ctx)
		require.NoError(t, err)
		assert.Equal(t, "page-2", cur)
		assert.False(t, fin)

		// A step whose fn fails moves neither the rows nor the cursor.
		err = a.Step(ctx, "page-3", func(ctx context.Context, tx pgx.Tx) error {
			if err := insertStock("a", 1)(ctx, tx); err != nil {
				return err
			}
			return context.DeadlineExceeded
		})
		require.ErrorIs(t, err, context.DeadlineExceeded)

		// A pauses; B takes over and resumes at A's cursor.
		b := s.Run(guardtest.Lease{Resource: "sync", Tok: 2, Who: "b"}, "2026-11-30")
		cur, fin, err = b.Resume(ctx)
		require.NoError(t, err)
		assert.Equal(t, "page-2", cur)
		assert.False(t, fin)
		require.NoError(t, b.Step(ctx, "page-3", insertStock("b", 1)))

		// A wakes up: its step is rejected, nothing of it is visible.
		ran := false
		err = a.Step(ctx, "page-3", func(ctx context.Context, tx pgx.Tx) error {
			ran = true
			return insertStock("a", 1)(ctx, tx)
		})
		require.ErrorIs(t, err, guard.ErrStaleToken)
		assert.False(t, ran)
		require.ErrorIs(t, a.Finish(ctx), guard.ErrStaleToken)
		cur, _, err = b.Resume(ctx)
		require.NoError(t, err)
		assert.Equal(t, "page-3", cur)
		assert.EqualValues(t, 2, rowsBy(t, db.Pool, "a"))
		assert.EqualValues(t, 1, rowsBy(t, db.Pool, "b"))

		require.NoError(t, b.Finish(ctx))
		require.NoError(t, b.Finish(ctx), "finishing a finished run is a no-op")
		cur, fin, err = b.Resume(ctx)
		require.NoError(t, err)
		assert.Equal(t, "page-3", cur)
		assert.True(t, fin)

		// A later holder: the run is a no-op.
		c := s.Run(guardtest.Lease{Resource: "sync", Tok: 3, Who: "c"}, "2026-11-30")
		_, fin, err = c.Resume(ctx)
		require.NoError(t, err)
		assert.True(t, fin)
		ran = false
		err = c.Step(ctx, "page-4", func(ctx context.Context, tx pgx.Tx) error { ran = true; return nil })
		require.ErrorIs(t, err, guard.ErrRunFinished)
		require.ErrorIs(t, err, guard.ErrAlreadyApplied)
		assert.False(t, ran)
		require.NoError(t, c.Finish(ctx))
		assert.EqualValues(t, 0, rowsBy(t, db.Pool, "c"))

		// Another run key of the same resource is independent.
		d := s.Run(guardtest.Lease{Resource: "sync", Tok: 3, Who: "c"}, "2026-12-01")
		require.NoError(t, d.Step(ctx, "page-1", nil))
		cur, fin, err = d.Resume(ctx)
		require.NoError(t, err)
		assert.Equal(t, "page-1", cur)
		assert.False(t, fin)
	})
}

func TestPrune(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	l := guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}

	for _, k := range []string{"k1", "k2", "k3"} {
		_, err := guard.Exec(ctx, s, l, insertStock(k, 1), guard.WithKey(k))
		require.NoError(t, err)
	}
	require.NoError(t, s.Run(l, "done").Finish(ctx))
	require.NoError(t, s.Run(l, "open").Step(ctx, "1", nil))

	n, err := s.Prune(ctx, time.Hour)
	require.NoError(t, err)
	assert.EqualValues(t, 0, n, "nothing is an hour old")

	// Age the rows instead of sleeping.
	mustExec(t, db.Pool, "UPDATE fencelock.applied SET applied_at = now() - interval '2 hours' WHERE key <> 'k3'")
	mustExec(t, db.Pool, "UPDATE fencelock.runs SET updated_at = now() - interval '2 hours', finished_at = CASE WHEN finished THEN now() - interval '2 hours' END")
	n, err = s.Prune(ctx, time.Hour)
	require.NoError(t, err)
	assert.EqualValues(t, 3, n, "k1, k2 and the finished run")
	assert.EqualValues(t, 1, count(t, db.Pool, "SELECT count(*) FROM fencelock.applied"))
	_, fin, err := s.Run(l, "open").Resume(ctx)
	require.NoError(t, err)
	assert.False(t, fin, "an unfinished run is never pruned")
	assert.EqualValues(t, 1, count(t, db.Pool, "SELECT count(*) FROM fencelock.runs WHERE run_key = 'open'"))
	assert.EqualValues(t, 1, storedToken(t, db.Pool, "r"), "tokens are never pruned")

	// A pruned key can be applied again; a kept one cannot.
	_, err = guard.Exec(ctx, s, l, insertStock("k1", 1), guard.WithKey("k1"))
	require.NoError(t, err)
	_, err = guard.Exec(ctx, s, l, insertStock("k3", 1), guard.WithKey("k3"))
	require.ErrorIs(t, err, guard.ErrAlreadyApplied)
}

// A step rewrites its run's row without touching an indexed column, so
// Postgres can update it in place (HOT: no new index entries). Counted in
// the step's own transaction, which pg_stat_xact_user_tables reports at
// once.
func TestRunStepIsHOTUpdate(t *testing.T) {
	db := newDB(t)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	l := guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}
	run := s.Run(l, "hot")
	require.NoError(t, run.Step(ctx, "1", nil))
	require.NoError(t, run.Step(ctx, "2", func(ctx context.Context, tx pgx.Tx) error {
		// What the commit does next, counted here: a step of the same
		// run in this transaction.
		_, err := tx.Exec(ctx, "SELECT fencelock.close('r', 1, 'a', NULL, 'hot', '2')")
		if err != nil {
			return err
		}
		var upd, hot int64
		if err := tx.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables
			WHERE schemaname = 'fencelock' AND relname = 'runs'`).Scan(&upd, &hot); err != nil {
			return err
		}
		assert.EqualValues(t, 1, upd, "one update of the run's row")
		assert.EqualValues(t, 1, hot, "and it was HOT")
		return nil
	}))
	cursor, fin, err := run.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, "2", cursor)
	assert.False(t, fin)
}
