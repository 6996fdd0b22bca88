package pgfence_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pgfenceStatements is how many statements a Store prepares: advance,
// BEGIN, the two opens (with and without a key or a run), the fence lock
// and the check of a plain commit, close, COMMIT.
const pgfenceStatements = 8

// preparedByPgfence counts pgfence's statements prepared on q's session.
func preparedByPgfence(t *testing.T, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int {
	t.Helper()
	var n int
	require.NoError(t, q.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'fencelock\_%'`, pgx.QueryExecModeExec).Scan(&n))
	return n
}

// On a connection straight to Postgres, pgfence prepares its statements
// once and binds them by name afterwards (the bench's profile: a third of
// the server CPU of a guarded transaction); WithoutPreparedStatements
// keeps them unnamed. Preparing costs a new connection two round trips,
// once: one to ask whether it is direct, one for all its statements
// (pgfenceStatements). A new Store's first call checks the schema's
// version, one round trip more, once per Store.
func TestPreparedOnDirectConnection(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	for _, c := range []struct {
		name      string
		opts      []pgstore.Option
		want      int
		firstTrip int64
	}{
		// advance, BEGIN, open, close, COMMIT; the first transaction: the
		// schema check, ask, prepare, then its own three.
		{"default", nil, pgfenceStatements, 6},
		{"WithoutPreparedStatements", []pgstore.Option{pgstore.WithoutPreparedStatements()}, 0, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			var writes atomic.Int64
			conn := connThrough(t, db.URL, func(c net.Conn) net.Conn { return writeCounter{Conn: c, writes: &writes} })
			s := newStore(t, conn, c.opts...)
			for i := range 3 {
				before := writes.Load()
				_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r-" + c.name, Tok: 1, Who: "a"}, insertStock("x", 1), guard.WithKey(string(rune('a'+i))))
				require.NoError(t, err)
				want := int64(3)
				if i == 0 {
					want = c.firstTrip
				}
				assert.Equal(t, want, writes.Load()-before, "round trips of transaction %d", i)
			}
			assert.Equal(t, c.want, preparedByPgfence(t, ctx, conn))
			assert.EqualValues(t, 3, count(t, db.Pool, "SELECT count(*) FROM stock"))
			mustExec(t, db.Pool, "DELETE FROM stock")
		})
	}
}

// WithoutPreparedStatements holds per Store, whichever Store met the
// connection first: on one connection, a Store that prepares binds open
// and close by name, one with the option sends them unnamed.
func TestPreparedIsPerStore(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	for _, unnamedFirst := range []bool{false, true} {
		var mu sync.Mutex
		var sent strings.Builder
		conn := connThrough(t, db.URL, func(c net.Conn) net.Conn { return sqlRecorder{Conn: c, mu: &mu, sent: &sent} })
		prepared, unnamed := newStore(t, conn), newStore(t, conn, pgstore.WithoutPreparedStatements())
		runs := func(s *pgfence.Store) (named, plain int) {
			mu.Lock()
			sent.Reset()
			mu.Unlock()
			_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insertStock("x", 1))
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			n1, u1 := stmtRuns(t, sent.String(), "open")
			n2, u2 := stmtRuns(t, sent.String(), "close")
			return n1 + n2, u1 + u2
		}
		order := []*pgfence.Store{prepared, unnamed}
		if unnamedFirst {
			order = []*pgfence.Store{unnamed, prepared}
		}
		for range 2 {
			for _, s := range order {
				named, plain := runs(s)
				if s == prepared {
					assert.Equal(t, [2]int{2, 0}, [2]int{named, plain}, "the Store that prepares (unnamed first: %v)", unnamedFirst)
				} else {
					assert.Equal(t, [2]int{0, 2}, [2]int{named, plain}, "the Store WithoutPreparedStatements (unnamed first: %v)", unnamedFirst)
				}
			}
		}
	}
}

// Through PgBouncer in transaction pooling mode the statements stay
// unnamed: one server connection, so the session the next transaction
// runs in is the one pgfence's ran in, and it holds none of them.
func TestUnnamedThroughPooler(t *testing.T) {
	url, direct := ownPgBouncer(t, 1)
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	s := newStore(t, conn)
	for range 3 {
		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insertStock("x", 1))
		require.NoError(t, err)
	}
	assert.Equal(t, 0, preparedByPgfence(t, ctx, conn))
	assert.EqualValues(t, 3, count(t, direct, "SELECT count(*) FROM stock"))
}

// pgfence's prepared statements dropped from the connection: by fn
// (DEALLOCATE ALL in the transaction), the transaction fails, says why
// and writes nothing; between transactions (DISCARD ALL, as a pool's
// reset query does), the next Exec prepares them again and succeeds. The
// connection keeps working either way.
func TestPreparedStatementsDropped(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec // fn's own statements are not pgfence's concern here
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	s := newStore(t, conn)
	l := guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}
	_, err = guard.Exec(ctx, s, l, insertStock("x", 1))
	require.NoError(t, err)
	require.Equal(t, pgfenceStatements, preparedByPgfence(t, ctx, conn))

	_, err = guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
		if err := insertStock("y", 1)(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DEALLOCATE ALL")
		return err
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "deallocated")
	assert.Contains(t, err.Error(), "nothing was written")
	assert.EqualValues(t, 0, count(t, db.Pool, "SELECT count(*) FROM stock WHERE writer = 'y'"))

	_, err = guard.Exec(ctx, s, l, insertStock("z", 1))
	require.NoError(t, err, "after DEALLOCATE ALL in fn")
	_, err = conn.Exec(ctx, "DISCARD ALL")
	require.NoError(t, err)
	require.Equal(t, 0, preparedByPgfence(t, ctx, conn))
	_, err = guard.Exec(ctx, s, l, insertStock("w", 1))
	require.NoError(t, err, "after DISCARD ALL between transactions")
	assert.Equal(t, pgfenceStatements, preparedByPgfence(t, ctx, conn), "prepared again, all together")
	assert.EqualValues(t, 3, count(t, db.Pool, "SELECT count(*) FROM stock"))
}
