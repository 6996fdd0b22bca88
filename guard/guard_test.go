package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lease is a lease with a Done channel and an Err, like *fence.Lock, whose
// loss the test controls.
type lease struct {
	name, holder string
	token        int64
	done         chan struct{}
	err          error
}

func newLease(name string, token int64) *lease {
	return &lease{name: name, holder: "h", token: token, done: make(chan struct{})}
}

func (l *lease) Name() string          { return l.name }
func (l *lease) Token() int64          { return l.token }
func (l *lease) Holder() string        { return l.holder }
func (l *lease) Done() <-chan struct{} { return l.done }
func (l *lease) Err() error {
	select {
	case <-l.done:
		return l.err
	default:
		return nil
	}
}

var errLost = errors.New("test: lock lost")

func (l *lease) lose() { l.err = errLost; close(l.done) }

// countingStore wraps a real store and counts Begin calls.
type countingStore struct {
	*pgfence.Store
	begins int
}

func (c *countingStore) Begin(ctx context.Context, cl guard.Claim) (guard.Txn[pgx.Tx], error) {
	c.begins++
	return c.Store.Begin(ctx, cl)
}

func setup(t *testing.T) (*pgxpool.Pool, *countingStore, context.Context) {
	t.Helper()
	db := testenv.NewDB(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.NoError(t, sqlDB.Close())
	_, err := db.Pool.Exec(ctx, "CREATE TABLE stock (sku text)")
	require.NoError(t, err)
	s, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	return db.Pool, &countingStore{Store: s}, ctx
}

func rows(t *testing.T, pool *pgxpool.Pool) (stock, fences int64) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT (SELECT count(*) FROM stock), (SELECT count(*) FROM fencelock.fence)").Scan(&stock, &fences))
	return
}

func insert(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, "INSERT INTO stock VALUES ('x')")
	return err
}

func TestLeaseLostBeforeStart(t *testing.T) {
	pool, s, ctx := setup(t)
	l := newLease("r", 1)
	l.lose()
	_, err := guard.Exec(ctx, s, l, insert)
	require.ErrorIs(t, err, guard.ErrLeaseLost)
	require.ErrorIs(t, err, errLost, "the lease's own reason is kept")
	assert.Zero(t, s.begins, "no transaction is started")
	stock, fences := rows(t, pool)
	assert.Zero(t, stock)
	assert.Zero(t, fences)
}

func TestLeaseLostDuringFn(t *testing.T) {
	pool, s, ctx := setup(t)

	t.Run("fn notices through its context", func(t *testing.T) {
		l := newLease("r", 1)
		_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx); err != nil {
				return err
			}
			l.lose()
			<-ctx.Done() // fn's context ends with the lease
			return insert(ctx, tx)
		})
		require.ErrorIs(t, err, guard.ErrLeaseLost)
	})
	t.Run("not committed after fn returns", func(t *testing.T) {
		l := newLease("r", 2)
		_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
			err := insert(ctx, tx)
			l.lose()
			return err // fn ignores the loss
		})
		require.ErrorIs(t, err, guard.ErrLeaseLost)
		require.ErrorIs(t, err, errLost)
	})
	stock, fences := rows(t, pool)
	assert.Zero(t, stock)
	// The tokens were recorded when the transactions began (so that an
	// older holder could not commit over them); only the rows went back.
	assert.EqualValues(t, 1, fences)
}

func TestExecWithHealthyLease(t *testing.T) {
	pool, s, ctx := setup(t)
	l := newLease("r", 1)
	res, err := guard.Exec(ctx, s, l, insert, guard.WithKey("k"))
	require.NoError(t, err)
	assert.Equal(t, guard.Result{Resource: "r", Token: 1, Holder: "h", Key: "k"}, res)
	stock, fences := rows(t, pool)
	assert.EqualValues(t, 1, stock)
	assert.EqualValues(t, 1, fences)
}

func TestCancelledContextDoesNotStart(t *testing.T) {
	pool, s, ctx := setup(t)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err := guard.Exec(cctx, s, newLease("r", 1), insert)
	require.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, s.begins)
	stock, _ := rows(t, pool)
	assert.Zero(t, stock)
}

func TestStaleTokenError(t *testing.T) {
	err := error(&guard.StaleTokenError{Resource: "stock:eu", Token: 4, Current: 9})
	require.ErrorIs(t, err, guard.ErrStaleToken)
	assert.Contains(t, err.Error(), `"stock:eu"`)
	assert.Contains(t, err.Error(), "token 4")
	assert.Contains(t, err.Error(), "token 9")
}

func TestNewClaim(t *testing.T) {
	c, err := guard.NewClaim(newLease("r", 3))
	require.NoError(t, err)
	assert.Equal(t, guard.Claim{Resource: "r", Token: 3, Holder: "h"}, c)
	_, err = guard.NewClaim(&lease{name: "r", token: 3})
	require.ErrorIs(t, err, guard.ErrInvalidLease)
}

// ctxLease is a lease whose Done and Err come from a context, as with
// *fence.Lock; Exec then hooks the context instead of watching Done.
type ctxLease struct {
	name  string
	token int64
	ctx   context.Context
}

func (l ctxLease) Name() string             { return l.name }
func (l ctxLease) Token() int64             { return l.token }
func (l ctxLease) Holder() string           { return "h" }
func (l ctxLease) Context() context.Context { return l.ctx }
func (l ctxLease) Done() <-chan struct{}    { return l.ctx.Done() }
func (l ctxLease) Err() error               { return context.Cause(l.ctx) }

func TestLeaseWithContextLostDuringFn(t *testing.T) {
	pool, s, ctx := setup(t)
	lctx, lose := context.WithCancelCause(context.Background())
	l := ctxLease{name: "r", token: 1, ctx: lctx}
	_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
		if err := insert(ctx, tx); err != nil {
			return err
		}
		lose(errLost)
		<-ctx.Done() // fn's context ends with the lease's
		return insert(ctx, tx)
	})
	require.ErrorIs(t, err, guard.ErrLeaseLost)
	stock, fences := rows(t, pool)
	assert.Zero(t, stock)
	assert.EqualValues(t, 1, fences, "the token is recorded at begin")

	// Lost before start: the lease's reason comes along.
	_, err = guard.Exec(ctx, s, l, insert)
	require.ErrorIs(t, err, guard.ErrLeaseLost)
	require.ErrorIs(t, err, errLost)
}
