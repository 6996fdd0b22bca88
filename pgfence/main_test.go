package pgfence_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

func TestMain(m *testing.M) {
	if os.Getenv(frozenLeaderEnv) != "" {
		frozenLeader() // a child of TestFrozenLeaderRefused
		return
	}
	testenv.Main(m)
}

// testTimeout bounds each test's database calls: generous, so a loaded
// machine does not fail a test, but a deadlock does.
const testTimeout = 2 * time.Minute

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newDB returns a fresh database with the fencelock schema applied from
// the embedded migration files.
func newDB(t testing.TB) *testenv.DB {
	t.Helper()
	db := testenv.NewDB(t)
	migrate(t, db.Pool)
	return db
}

func migrate(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, sqlDB); err != nil {
		t.Fatalf("migrations.Up: %v", err)
	}
}

func newStore(t testing.TB, db pgfence.DB, opts ...pgstore.Option) *pgfence.Store {
	t.Helper()
	return msgtest.NewStore(t, pgfence.New, db, opts...)
}

func mustExec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// storedToken is the token the database holds for resource (0 if none).
func storedToken(t testing.TB, pool *pgxpool.Pool, resource string) int64 {
	t.Helper()
	return count(t, pool, "SELECT coalesce((SELECT token FROM fencelock.fence WHERE resource = $1), 0)", resource)
}

// stockTable creates the table the tests write "stock rows" to.
func stockTable(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	mustExec(t, pool, "CREATE TABLE stock (sku text NOT NULL, qty int NOT NULL, writer text NOT NULL)")
}

// testenvNewDB is a fresh database without the fencelock schema.
func testenvNewDB(t testing.TB) *testenv.DB { return testenv.NewDB(t) }

// proxiedPool is a one-connection pool to db through a fault proxy,
// connected before it returns.
func proxiedPool(t testing.TB, db *testenv.DB) (*pgxpool.Pool, *testenv.Proxy) {
	t.Helper()
	proxy, err := testenv.NewProxy(db.Server.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(proxy.Addr)
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pool, proxy
}

// onBothPaths runs f against a fresh database with the fencelock schema,
// reached directly and through PgBouncer in transaction pooling mode with
// pgx's default exec mode (testenv's shared PgBouncer). db.Pool always
// goes straight to the server, for setup and assertions; pool is what the
// code under test uses.
func onBothPaths(t *testing.T, f func(t *testing.T, db *testenv.DB, pool *pgxpool.Pool)) {
	t.Helper()
	t.Run("direct", func(t *testing.T) {
		db := newDB(t)
		f(t, db, db.Pool)
	})
	t.Run("pgbouncer", func(t *testing.T) {
		bdb := testenv.NewDBViaPgBouncer(t)
		direct, err := pgxpool.New(context.Background(), bdb.DirectURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(direct.Close)
		migrate(t, direct) // goose takes a session advisory lock: not through a transaction pooler
		db := *bdb
		db.Pool = direct
		f(t, &db, bdb.Pool)
	})
}

// connThrough opens a connection to url whose socket is wrapped by wrap (a
// recorder, a write counter, a fault), closed with the test.
func connThrough(t testing.TB, url string, wrap func(net.Conn) net.Conn) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrap(c), nil
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// ownPgBouncer starts a PgBouncer of its own (transaction pooling,
// serverConns server connections) in front of a fresh database with the
// fencelock schema and the stock table. url goes through PgBouncer;
// direct is a pool straight to the database, for setup and assertions.
func ownPgBouncer(t *testing.T, serverConns int) (url string, direct *pgxpool.Pool) {
	t.Helper()
	pg, err := testenv.SharedPostgres()
	if err != nil {
		t.Fatal(err)
	}
	b, err := testenv.StartPgBouncer(pg, serverConns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	db := b.NewDB(t)
	direct, err = pgxpool.New(context.Background(), db.DirectURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	migrate(t, direct) // goose takes a session advisory lock: not through a transaction pooler
	stockTable(t, direct)
	return db.URL, direct
}
