package sqlfence_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/testenv"
)

// Harness runs guardtest's contract on sqlfence over the database/sql
// driver named driver ("pgx" here; the examples module runs it with
// lib/pq's "postgres").
func Harness(driver string) guardtest.Harness[*sql.Tx] {
	return msgtest.Harness(func(t testing.TB) guardtest.Database[*sql.Tx] {
		tdb, db := newDB(t)
		return sqlDatabase{url: tdb.URL, driver: driver, db: db}
	})
}

func TestContract(t *testing.T) { guardtest.Run(t, Harness("pgx")) }

// sqlDatabase is guardtest's view of a test database through database/sql.
type sqlDatabase struct {
	url, driver string
	db          *sql.DB
}

func (d sqlDatabase) NewStore(t testing.TB) guard.Store[*sql.Tx] {
	return newStore(t, openDB(t, d.driver, d.url))
}

func (d sqlDatabase) Exec(ctx context.Context, q string, args ...any) error {
	_, err := d.db.ExecContext(ctx, q, args...)
	return err
}

func (d sqlDatabase) QueryInt(ctx context.Context, q string, args ...any) (n int64, err error) {
	err = d.db.QueryRowContext(ctx, q, args...).Scan(&n)
	return n, err
}

func (sqlDatabase) TxExec(ctx context.Context, tx *sql.Tx, q string, args ...any) error {
	_, err := tx.ExecContext(ctx, q, args...)
	return err
}

func (sqlDatabase) TxQueryInt(ctx context.Context, tx *sql.Tx, q string, args ...any) (n int64, err error) {
	err = tx.QueryRowContext(ctx, q, args...).Scan(&n)
	return n, err
}

func (sqlDatabase) TxCommit(_ context.Context, tx *sql.Tx) error { return tx.Commit() }

var _ = testenv.NewDB
