package inventory_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/testenv"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	_ "github.com/lib/pq"              // driver "postgres"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newDB is a fresh database with the fencelock schema; it returns its URL.
func newDB(t testing.TB) string {
	t.Helper()
	tdb := testenv.NewDB(t)
	db := openDB(t, "pgx", tdb.URL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("migrations.Up: %v", err)
	}
	return tdb.URL
}

func openDB(t testing.TB, driver, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, url)
	if err != nil {
		t.Fatalf("sql.Open(%q): %v", driver, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
