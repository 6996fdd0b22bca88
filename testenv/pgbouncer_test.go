package testenv_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// simpleConn connects with the simple protocol (no prepared statements),
// which works through any pooler.
func simpleConn(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	c, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func backendPID(t *testing.T, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int {
	t.Helper()
	var pid int
	require.NoError(t, q.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	return pid
}

// A private PgBouncer with one server connection: queries go through it,
// two clients share that one server connection (transaction pooling), a
// client's open transaction keeps it until the transaction ends, a role
// made by the test can log in, and Stop leaves no process behind.
func TestPgBouncerTransactionPooling(t *testing.T) {
	pg, err := testenv.SharedPostgres()
	require.NoError(t, err)
	var pid int
	t.Run("inner", func(t *testing.T) {
		b, err := testenv.StartPgBouncer(pg, 1)
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Stop() })
		pid = b.PID()
		require.NotZero(t, pid)
		ctx := ctxT(t, 60*time.Second)

		db := b.NewDB(t)
		assert.Contains(t, db.URL, b.Addr)
		assert.NotContains(t, db.DirectURL, b.Addr)
		var n int
		require.NoError(t, simpleConn(t, ctx, db.URL).QueryRow(ctx, "SELECT 41 + 1").Scan(&n))
		assert.Equal(t, 42, n)

		c1, c2 := simpleConn(t, ctx, db.URL), simpleConn(t, ctx, db.URL)
		direct := simpleConn(t, ctx, db.DirectURL)
		p1, p2 := backendPID(t, ctx, c1), backendPID(t, ctx, c2)
		assert.Equal(t, p1, p2, "two clients, one server connection")
		assert.NotEqual(t, p1, backendPID(t, ctx, direct), "DirectURL bypasses PgBouncer")

		// Transaction pooling, not statement pooling: c1's transaction
		// holds the server connection, c2 waits until it commits.
		tx, err := c1.Begin(ctx)
		require.NoError(t, err)
		assert.Equal(t, p1, backendPID(t, ctx, tx))
		got := make(chan int, 1)
		go func() {
			var pid int
			if c2.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid) != nil {
				pid = -1
			}
			got <- pid
		}()
		// c2 is queued in PgBouncer (its admin console counts it).
		admin := simpleConn(t, ctx, b.URL("pgbouncer"))
		require.Eventually(t, func() bool { return clientsWaiting(t, ctx, admin, db.Name) == 1 },
			20*time.Second, 20*time.Millisecond)
		select {
		case <-got:
			t.Fatal("c2 ran while c1's transaction held the only server connection")
		default:
		}
		require.NoError(t, tx.Commit(ctx))
		select {
		case p := <-got:
			assert.Equal(t, p1, p)
		case <-time.After(30 * time.Second):
			t.Fatal("c2 did not get the server connection after c1 committed")
		}

		// A role the test creates logs in through it (auth_query).
		bb := make([]byte, 4)
		_, _ = rand.Read(bb)
		role := "fl_bouncer_" + hex.EncodeToString(bb)
		_, err = direct.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
		require.NoError(t, err)
		t.Cleanup(func() {
			c, err := pgx.Connect(context.Background(), pg.URL("postgres"))
			if err == nil {
				_, _ = c.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
				_ = c.Close(context.Background())
			}
		})
		cfg, err := pgx.ParseConfig(db.URL)
		require.NoError(t, err)
		cfg.User = role
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		rc, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		var who string
		require.NoError(t, rc.QueryRow(ctx, "SELECT current_user").Scan(&who))
		_ = rc.Close(ctx)
		assert.Equal(t, role, who)
	})
	assert.False(t, testenv.ProcessAlive(pid), "pgbouncer %d outlived cleanup", pid)
}

// The shared PgBouncer sits in front of the shared Postgres, serves
// NewDBViaPgBouncer's pools, and is stopped by StopShared (what Main runs).
func TestSharedPgBouncer(t *testing.T) {
	b, err := testenv.SharedPgBouncer()
	require.NoError(t, err)
	again, err := testenv.SharedPgBouncer()
	require.NoError(t, err)
	assert.Same(t, b, again)
	pg, err := testenv.SharedPostgres()
	require.NoError(t, err)
	assert.Same(t, pg, b.Upstream)
	assert.Equal(t, testenv.DefaultPgBouncerPoolSize, b.PoolSize)

	ctx := ctxT(t, 60*time.Second)
	var pid int
	t.Run("db", func(t *testing.T) {
		db := testenv.NewDBViaPgBouncer(t)
		assert.Contains(t, db.URL, b.Addr)
		c := simpleConn(t, ctx, db.URL)
		var name string
		require.NoError(t, c.QueryRow(ctx, "SELECT current_database()").Scan(&name))
		assert.Equal(t, db.Name, name)
		// The pool has pgx's defaults: through transaction pooling its
		// prepared statements are not guaranteed to work, but a query
		// outside a transaction does on a fresh pool.
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT 1").Scan(new(int)))
		pid = b.PID()
	})
	testenv.StopShared()
	assert.False(t, testenv.ProcessAlive(pid), "shared pgbouncer %d outlived StopShared", pid)
	fresh, err := testenv.SharedPgBouncer()
	require.NoError(t, err)
	assert.NotSame(t, b, fresh, "a new one on next use")
}

// clientsWaiting is cl_waiting of database db in PgBouncer's SHOW POOLS.
func clientsWaiting(t *testing.T, ctx context.Context, admin *pgx.Conn, db string) int {
	t.Helper()
	rows, err := admin.Query(ctx, "SHOW POOLS")
	require.NoError(t, err)
	defer rows.Close()
	dbCol, waitCol := -1, -1
	for i, f := range rows.FieldDescriptions() {
		switch f.Name {
		case "database":
			dbCol = i
		case "cl_waiting":
			waitCol = i
		}
	}
	require.True(t, dbCol >= 0 && waitCol >= 0, "SHOW POOLS columns")
	n := 0
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		if fmt.Sprint(vals[dbCol]) == db {
			w, err := strconv.Atoi(fmt.Sprint(vals[waitCol]))
			require.NoError(t, err)
			n += w
		}
	}
	require.NoError(t, rows.Err())
	return n
}
