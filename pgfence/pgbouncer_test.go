package pgfence_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The guard/pgfence operations through PgBouncer in transaction pooling
// mode (two server connections, so transactions of different clients
// share them), with pools in pgx's default exec mode (cache_statement)
// and in exec mode, each across an application restart (a new pool: the
// server connections keep the statements the old one prepared). pgfence's
// own statements are unnamed, so they work whatever the pool's mode.
// Advance, Run.Resume, Prune and Exec must not meet prepared statement
// "stmtcache_..." already exists (42P05) or does not exist (26000) in
// the default mode. fn's statements pass their exec mode
// explicitly, as docs/operations.md says fn must behind a transaction pooler.
func TestThroughPgBouncer(t *testing.T) {
	url, direct := ownPgBouncer(t, 2)
	ctx := testCtx(t)
	mustExec(t, direct, "CREATE TABLE guarded (sku text NOT NULL)")

	token := int64(0)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		for restart := range 2 {
			t.Run(fmt.Sprintf("%v/pool %d", mode, restart), func(t *testing.T) {
				cfg, err := pgxpool.ParseConfig(url)
				require.NoError(t, err)
				cfg.ConnConfig.DefaultQueryExecMode = mode
				cfg.MaxConns = 4
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				require.NoError(t, err)
				defer pool.Close()
				throughPooler(ctx, t, pool, direct, fmt.Sprintf("%v-%d", mode, restart), &token)
			})
		}
	}
}

func throughPooler(ctx context.Context, t *testing.T, pool, direct *pgxpool.Pool, tag string, token *int64) {
	s := newStore(t, pool)
	insert := func(writer string) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO stock (sku, qty, writer) VALUES ($1, $2, $3)", pgx.QueryExecModeExec, "sku", 1, writer)
			return err
		}
	}
	rows := func(writer string) int64 {
		return count(t, direct, "SELECT count(*) FROM stock WHERE writer = $1", writer)
	}
	*token += 10
	l := guardtest.Lease{Resource: "r", Tok: *token, Who: "h-" + tag}
	require.NoError(t, s.Advance(ctx, l))
	require.ErrorIs(t, s.Advance(ctx, guardtest.Lease{Resource: "r", Tok: *token - 1, Who: "old"}), guard.ErrStaleToken)

	w := "exec-" + tag
	_, err := guard.Exec(ctx, s, l, insert(w), guard.WithKey(w))
	require.NoError(t, err)
	_, err = guard.Exec(ctx, s, l, insert(w), guard.WithKey(w))
	require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: *token - 1, Who: "old"}, insert(w))
	require.ErrorIs(t, err, guard.ErrStaleToken)
	assert.EqualValues(t, 1, rows(w))

	// fn's own commit is refused; a raw COMMIT is reported.
	_, err = guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
		if err := insert("owned-"+tag)(ctx, tx); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	require.ErrorIs(t, err, guard.ErrTxOwned)
	assert.Zero(t, rows("owned-"+tag))
	_, err = guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
		if err := insert("raw-"+tag)(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "COMMIT")
		return err
	})
	require.ErrorIs(t, err, guard.ErrTxEnded)

	// Resumable run.
	run := s.Run(l, "run-"+tag)
	cursor, finished, err := run.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, "", cursor)
	assert.False(t, finished)
	require.NoError(t, run.Step(ctx, "1", insert("run-"+tag)))
	cursor, _, err = run.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, "1", cursor)
	require.NoError(t, run.Finish(ctx))
	require.ErrorIs(t, run.Step(ctx, "2", insert("run-"+tag)), guard.ErrRunFinished)
	assert.EqualValues(t, 1, rows("run-"+tag))
	_, err = s.Prune(ctx, 0)
	require.NoError(t, err)

	// Protect: a guarded write passes; the claim's settings do not leak
	// into the next transaction on the same server connection (a raw
	// write without a claim is refused).
	require.NoError(t, s.Protect(ctx, "guarded"))
	_, err = guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO guarded VALUES ($1)", pgx.QueryExecModeExec, tag)
		return err
	})
	require.NoError(t, err)
	for range 4 {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO guarded VALUES ('raw')")
			return err
		})
		require.ErrorIs(t, pgfence.MapError(err), guard.ErrNotClaimed)
	}

	// Concurrent guarded writes over the shared server connections.
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				_, err := guard.Exec(ctx, s, l, insert("many-"+tag), guard.WithKey(fmt.Sprintf("%s-%d-%d", tag, g, i)))
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.EqualValues(t, 40, rows("many-"+tag))
}
