package sqlfence_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const testTimeout = 2 * time.Minute

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// openDB opens a *sql.DB with driver on url, closed when t ends.
func openDB(t testing.TB, driver, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, url)
	if err != nil {
		t.Fatalf("sql.Open(%q): %v", driver, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// newDB is a fresh database with the fencelock schema, and a *sql.DB on
// it through pgx's database/sql driver.
func newDB(t testing.TB) (*testenv.DB, *sql.DB) {
	t.Helper()
	tdb := testenv.NewDB(t)
	db := openDB(t, "pgx", tdb.URL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("migrations.Up: %v", err)
	}
	return tdb, db
}

func newStore(t testing.TB, db *sql.DB, opts ...pgstore.Option) *sqlfence.Store {
	t.Helper()
	return msgtest.NewStore(t, sqlfence.New, db, opts...)
}

func mustExec(t testing.TB, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func count(t testing.TB, db *sql.DB, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// insert returns an fn that writes one stock row as writer.
func insert(writer string) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO stock (sku, writer) VALUES ('a', $1)", writer)
		return err
	}
}

var _ guard.Store[*sql.Tx] = (*sqlfence.Store)(nil)
