package pgfence_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingObserver counts the guarded writes reported to it.
type countingObserver struct{ n atomic.Int64 }

func (o *countingObserver) OnExec(context.Context, guard.ExecEvent) { o.n.Add(1) }

// The options that moved to package pgstore keep their pgfence names
// until v0.3.0, and they are the same options: set for the transaction,
// reported to, refused alike.
func TestDeprecatedOptions(t *testing.T) {
	db := newDB(t)
	ctx := testCtx(t)
	obs := &countingObserver{}
	s := newStore(t, db.Pool, pgfence.WithLockTimeout(250*time.Millisecond), pgfence.WithIdleTimeout(time.Minute), pgfence.WithObserver(obs))
	var lockTimeout, idle string
	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')").Scan(&lockTimeout, &idle)
	})
	require.NoError(t, err)
	assert.Equal(t, "250ms", lockTimeout)
	assert.Equal(t, "1min", idle)
	assert.EqualValues(t, 1, obs.n.Load(), "the observer is the store's")

	for _, o := range []pgfence.Option{pgfence.WithLockTimeout(0), pgfence.WithIdleTimeout(0), pgfence.WithObserver(nil)} {
		_, err := pgfence.New(db.Pool, o)
		assert.ErrorIs(t, err, guard.ErrInvalidOption)
	}
}
