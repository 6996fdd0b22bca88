package tick_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/tick"
	"github.com/fencelock/fencelock/tick/ticktest"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var _ tick.Store[sqlfence.Run, *sql.Tx] = (*sqlfence.Store)(nil)

// sqlfence's runs serve ticks as pgfence's do: the step commits, a second
// call finds the tick done.
func TestSQLFenceStore(t *testing.T) {
	env := ticktest.NewEnv(t)
	ctx := testCtx(t)
	db, err := sql.Open("pgx", env.DB.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqlfence.New(db)
	require.NoError(t, err)
	inst := env.NewInstance(t)
	r, err := tick.New(inst.Locks, store)
	require.NoError(t, err)
	at := past()
	job := func(ctx context.Context, tk *tick.Tick[sqlfence.Run]) error {
		return tk.Run.Step(ctx, "1", func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO tick_effects (job, tick, step, steps, token, instance) VALUES ($1, $2, 1, 1, $3, 'sql')`,
				tk.Job, tk.At, tk.Lock.Token())
			return err
		})
	}
	first, err := r.Run(ctx, "sync", minute, at, job)
	require.NoError(t, err)
	assert.Equal(t, tick.Ran, first.Result)
	again, err := r.Run(ctx, "sync", minute, at, job)
	require.NoError(t, err)
	assert.Equal(t, tick.AlreadyDone, again.Result)
	assert.Equal(t, first.Token, again.Token)
	assert.Equal(t, []ticktest.TickCount{{Tick: at.UTC(), Runs: 1, Holders: 1}}, count(t, env, "sync"))
}
