package pgfence_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
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
	conn := connThrough(t, db.URL, func(c net.Conn) net.Conn { return writeCounter{Conn: c, writes: &writes} })
	s := newStore(t, conn)
	write := insertStock("x", 1)
	l := guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}

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
	_, err := guard.Exec(ctx, s, l, write)
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
	// and the claim and COMMIT apart; this is the new Store's first call,
	// which checks the schema's version (once per Store).
	slow := newStore(t, wrappedConn{conn})
	o := roundTrips(func() {
		_, err := guard.Exec(ctx, slow, l, write)
		require.NoError(t, err)
	})
	assert.EqualValues(t, 3, p, "plain: BEGIN, INSERT, COMMIT")
	assert.Equal(t, p, g, "guarded")
	assert.Equal(t, p, k, "guarded with a key")
	assert.Equal(t, p+4, o, "generic DB path, with the schema check")
}

type wrappedConn struct{ *pgx.Conn }

// sqlRecorder keeps what the client sends, to tell which statements went
// out.
type sqlRecorder struct {
	net.Conn
	mu   *sync.Mutex
	sent *strings.Builder
}

func (c sqlRecorder) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.sent.Write(b)
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// advanceRuns counts the runs of fencelock.advance the client asked for in
// the frontend messages sent.
func advanceRuns(t *testing.T, sent string) int {
	t.Helper()
	named, unnamed := stmtRuns(t, sent, "advance")
	return named + unnamed
}

// stmtRuns counts the runs of pgfence's statement what (advance, open,
// close, ...) the client asked for in the frontend messages sent: named,
// a Bind of the statement pgfence prepared for it (fencelock_<what>_...);
// unnamed, an unnamed Parse of its text (each is followed by its Bind).
// Preparing it (a named Parse) is not a run.
func stmtRuns(t *testing.T, sent, what string) (named, unnamed int) {
	t.Helper()
	b := pgproto3.NewBackend(strings.NewReader(sent), io.Discard)
	for {
		msg, err := b.Receive()
		if err != nil {
			// The end of what was sent (pgproto3 reports it as an
			// unexpected EOF when it reads ahead).
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("decoding what the client sent: %v", err)
			}
			return named, unnamed
		}
		switch m := msg.(type) {
		case *pgproto3.Bind:
			if strings.HasPrefix(m.PreparedStatement, "fencelock_"+what+"_") {
				named++
			}
		case *pgproto3.Parse:
			if m.Name == "" && strings.Contains(m.Query, "fencelock."+what+"(") {
				unnamed++
			}
		}
	}
}

// A Store sends advance only for a claim it has not seen stored yet: the
// second transaction of the same lease goes without it, a new token (or
// holder) sends it again, and a newer holder that advanced through
// another Store still gets the cached holder refused.
func TestAdvanceSentOncePerClaim(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	var mu sync.Mutex
	var sent strings.Builder
	conn := connThrough(t, db.URL, func(c net.Conn) net.Conn { return sqlRecorder{Conn: c, mu: &mu, sent: &sent} })
	s := newStore(t, conn)
	advances := func(f func()) int {
		mu.Lock()
		sent.Reset()
		mu.Unlock()
		f()
		mu.Lock()
		defer mu.Unlock()
		return advanceRuns(t, sent.String())
	}
	exec := func(l guardtest.Lease, opts ...guard.Option) func() {
		return func() {
			_, err := guard.Exec(ctx, s, l, insertStock(l.Who, 1), opts...)
			require.NoError(t, err)
		}
	}

	assert.Equal(t, 1, advances(exec(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"})), "first transaction of a lease")
	assert.Equal(t, 0, advances(exec(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"})), "same lease again")
	assert.Equal(t, 0, advances(exec(guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, guard.WithKey("k"))), "same lease, with a key")
	assert.Equal(t, 0, advances(func() {
		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insertStock("a", 1), guard.WithKey("k"))
		require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	}), "same lease, refused key")
	assert.Equal(t, 1, advances(exec(guardtest.Lease{Resource: "r", Tok: 2, Who: "b"})), "new token")
	assert.Equal(t, 1, advances(exec(guardtest.Lease{Resource: "other", Tok: 2, Who: "b"})), "other resource")
	assert.Equal(t, 0, advances(exec(guardtest.Lease{Resource: "r", Tok: 2, Who: "b"})), "cached again")
	assert.Equal(t, 0, advances(func() {
		require.NoError(t, s.Run(guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}, "run").Step(ctx, "1", nil))
	}), "a run step of the same lease")

	// A stale token is refused by advance and not cached: it is sent (and
	// refused) every time.
	for range 2 {
		assert.Equal(t, 1, advances(func() {
			_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insertStock("a", 1))
			require.ErrorIs(t, err, guard.ErrStaleToken)
		}), "stale token")
	}

	// A newer holder advances through another Store: the cached lease
	// sends no advance, and is refused all the same, nothing written.
	other := newStore(t, db.Pool)
	require.NoError(t, other.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 3, Who: "c"}))
	before := count(t, db.Pool, "SELECT count(*) FROM stock")
	assert.Equal(t, 0, advances(func() {
		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}, insertStock("b", 1))
		var stale *guard.StaleTokenError
		require.ErrorAs(t, err, &stale)
		assert.EqualValues(t, 3, stale.Current)
	}), "cached, refused by precheck")
	assert.Equal(t, before, count(t, db.Pool, "SELECT count(*) FROM stock"))
	assert.EqualValues(t, 3, storedToken(t, db.Pool, "r"))

	// Advance fills the cache too.
	require.NoError(t, s.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 4, Who: "d"}))
	assert.Equal(t, 0, advances(exec(guardtest.Lease{Resource: "r", Tok: 4, Who: "d"})), "after Advance")
}
