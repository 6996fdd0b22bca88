package pgfence_test

import (
	"context"
	"net"
	"strconv"
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

// The connection is cut in the middle of fn, then partitioned during the
// next attempt: each Exec fails, nothing of it is visible, and once the
// network is back the same store works again.
func TestConnectionFaults(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	proxy, err := testenv.NewProxy(db.Server.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	host, port, _ := net.SplitHostPort(proxy.Addr)
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := newStore(t, pool)
	l := guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}

	// Cut mid-fn.
	_, err = guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
		if err := insertStock("cut", 2)(ctx, tx); err != nil {
			return err
		}
		proxy.Cut()
		return insertStock("cut", 1)(ctx, tx)
	}, guard.WithKey("k"))
	require.Error(t, err)
	proxy.Restore()

	// Partitioned (data held back) while fn runs: the caller's deadline
	// ends the call.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = guard.Exec(short, s, l, func(ctx context.Context, tx pgx.Tx) error {
		proxy.Blackhole()
		return insertStock("hole", 1)(ctx, tx)
	}, guard.WithKey("k"))
	cancel()
	require.Error(t, err)
	proxy.Restore()

	// The server rolled both back (it sees the connections go).
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "cut"))
	assert.EqualValues(t, 0, rowsBy(t, db.Pool, "hole"))
	// Back to normal: the key was never recorded, so the batch applies.
	_, err = guard.Exec(ctx, s, l, insertStock("ok", 1), guard.WithKey("k"))
	require.NoError(t, err)
	assert.EqualValues(t, 1, rowsBy(t, db.Pool, "ok"))
}
