package sqlfence_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
)

// guard's contract on sqlfence behind PgBouncer in transaction pooling
// mode, with pgx's driver in exec mode (what docs/operations.md tells users of a
// transaction pooler): each store, like another process, has a PgBouncer
// of its own in front of the test database, so that one opened after the
// database was made read-only gets server connections that see it so.
func TestContractPgBouncer(t *testing.T) {
	h := Harness("pgx")
	h.Open = func(t testing.TB) guardtest.Database[*sql.Tx] {
		tdb, db := newDB(t)
		return bouncedDatabase{sqlDatabase: sqlDatabase{url: tdb.URL, driver: "pgx", db: db}, tdb: tdb}
	}
	guardtest.Run(t, h)
}

type bouncedDatabase struct {
	sqlDatabase
	tdb *testenv.DB
}

func (d bouncedDatabase) NewStore(t testing.TB) guard.Store[*sql.Tx] {
	t.Helper()
	b, err := testenv.StartPgBouncer(d.tdb.Server, 4)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	db := openDB(t, "pgx", b.URL(d.tdb.Name)+"&default_query_exec_mode=exec")
	var one int
	if err := db.QueryRowContext(context.Background(), "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("through pgbouncer: %v", err)
	}
	s, err := sqlfence.New(db)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
