package pgfence_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Names past the limits are refused before anything is sent: a clear
// error, no fn, no fence row, never the server's "index row size ...
// exceeds btree version 4 maximum" (54000) after fn ran; and the limits
// themselves fit the btree (a name at the limit
// works, with a key at the limit).
func TestOversizedNames(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	var writes atomic.Int64
	conn := connThrough(t, db.URL, func(c net.Conn) net.Conn { return writeCounter{Conn: c, writes: &writes} })
	s := newStore(t, conn)

	long := func(n int) string { return strings.Repeat("é", n/2) + strings.Repeat("x", n%2) }
	ran := false
	fn := func(ctx context.Context, tx pgx.Tx) error {
		ran = true
		return insertStock("x", 1)(ctx, tx)
	}
	before := writes.Load()
	for _, tc := range []struct {
		name string
		err  error
		call func() error
	}{
		{"resource", guard.ErrInvalidLease, func() error {
			_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: long(2800), Tok: 1, Who: "a"}, fn)
			return err
		}},
		{"holder", guard.ErrInvalidLease, func() error {
			_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: long(guard.MaxHolderLen + 1)}, fn)
			return err
		}},
		{"key", guard.ErrInvalidOption, func() error {
			_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, fn, guard.WithKey(long(guard.MaxKeyLen+1)))
			return err
		}},
		{"run key", guard.ErrInvalidInput, func() error {
			return s.Run(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, long(guard.MaxKeyLen+1)).Step(ctx, "1", fn)
		}},
		{"cursor", guard.ErrInvalidInput, func() error {
			return s.Run(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, "run").Step(ctx, long(guard.MaxCursorLen+1), fn)
		}},
		{"advance", guard.ErrInvalidLease, func() error {
			return s.Advance(ctx, guardtest.Lease{Resource: long(guard.MaxResourceLen + 1), Tok: 1, Who: "a"})
		}},
		{"protect", guard.ErrInvalidOption, func() error {
			return s.Protect(ctx, "stock", pgfence.ForResource(long(guard.MaxResourceLen+1)))
		}},
	} {
		err := tc.call()
		require.ErrorIs(t, err, tc.err, tc.name)
		require.ErrorIs(t, err, guard.ErrInvalidInput, tc.name)
		assert.Contains(t, err.Error(), "at most", tc.name)
		assert.NotContains(t, err.Error(), "\n", tc.name)
	}
	assert.Equal(t, before, writes.Load(), "nothing was sent")
	assert.False(t, ran)
	assert.Zero(t, count(t, db.Pool, "SELECT count(*) FROM fencelock.fence"))

	// At the limits, everything fits.
	atLimit := guardtest.Lease{Resource: long(guard.MaxResourceLen), Tok: 1, Who: long(guard.MaxHolderLen)}
	_, err := guard.Exec(ctx, s, atLimit, fn, guard.WithKey(long(guard.MaxKeyLen)))
	require.NoError(t, err)
	require.NoError(t, s.Run(atLimit, long(guard.MaxKeyLen)).Step(ctx, "1", nil))
	assert.True(t, ran)
}
