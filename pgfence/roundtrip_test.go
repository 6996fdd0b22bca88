package pgfence_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeCounter counts the client's writes to the server: pgx sends each
// round trip's messages in one write, so the count of writes per
// transaction is its count of round trips.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// The check rides in the BEGIN round trip and the claim (with the
// idempotency key) in the COMMIT round trip: a guarded one-row write takes
// exactly as many round trips as the same write in a plain transaction.
func TestGuardedWriteAddsNoRoundTrip(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	var writes atomic.Int64
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{Conn: c, writes: &writes}, nil
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	s := newStore(t, conn)
	write := insertStock("x", 1)
	l := lease{"r", 1, "a"}

	plain := func() {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, write(ctx, tx))
		require.NoError(t, tx.Commit(ctx))
	}
	roundTrips := func(f func()) int64 {
		before := writes.Load()
		f()
		return writes.Load() - before
	}
	// Warm up: the INSERT's statement is prepared and cached on first use.
	plain()
	_, err = guard.Exec(ctx, s, l, write)
	require.NoError(t, err)

	p := roundTrips(plain)
	g := roundTrips(func() {
		_, err := guard.Exec(ctx, s, l, write)
		require.NoError(t, err)
	})
	k := roundTrips(func() {
		_, err := guard.Exec(ctx, s, l, write, guard.WithKey("batch-1"))
		require.NoError(t, err)
	})
	// The counter sees extra round trips when there are some: the generic
	// path for other DB implementations sends BEGIN and the check apart,
	// and the claim and COMMIT apart.
	slow := newStore(t, wrappedConn{conn})
	o := roundTrips(func() {
		_, err := guard.Exec(ctx, slow, l, write)
		require.NoError(t, err)
	})
	assert.EqualValues(t, 3, p, "plain: BEGIN, INSERT, COMMIT")
	assert.Equal(t, p, g, "guarded")
	assert.Equal(t, p, k, "guarded with a key")
	assert.Equal(t, p+3, o, "generic DB path")
}

type wrappedConn struct{ *pgx.Conn }
