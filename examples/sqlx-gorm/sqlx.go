package inventory

import (
	"context"
	"database/sql"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/jmoiron/sqlx"
)

// SQLXWorker syncs batches with sqlx. sqlfence hands fn a *sql.Tx, the
// transaction it checks and commits; sqlx binds the named parameters
// (db.BindNamed knows the driver's placeholder style) and the statement
// runs on that *sql.Tx.
type SQLXWorker struct {
	DB    *sqlx.DB
	Store *sqlfence.Store
	Name  string // written to each row, to tell writers apart
}

// NewSQLXWorker returns a worker over db (any Postgres driver).
func NewSQLXWorker(db *sqlx.DB, name string) (*SQLXWorker, error) {
	s, err := sqlfence.New(db.DB)
	if err != nil {
		return nil, err
	}
	return &SQLXWorker{DB: db, Store: s, Name: name}, nil
}

// stockRow is what one INSERT binds.
type stockRow struct {
	Row
	Batch  string `db:"batch"`
	Writer string `db:"writer"`
}

// Sync writes b under lease, once: it returns a *guard.StaleTokenError if
// a newer holder has taken over (nothing written) and an error wrapping
// guard.ErrAlreadyApplied if b was applied before, by anyone (skipped).
func (w *SQLXWorker) Sync(ctx context.Context, lease guard.Lease, b Batch) error {
	_, err := guard.Exec(ctx, w.Store, lease, func(ctx context.Context, tx *sql.Tx) error {
		for _, r := range b.Rows {
			q, args, err := w.DB.BindNamed(
				`INSERT INTO stock (sku, qty, batch, writer) VALUES (:sku, :qty, :batch, :writer)`,
				stockRow{Row: r, Batch: b.ID, Writer: w.Name})
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, q, args...); err != nil {
				return err
			}
		}
		return nil
	}, guard.WithKey(b.ID))
	return err
}
