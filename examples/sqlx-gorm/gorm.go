package inventory

import (
	"context"
	"database/sql"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/sqlfence"
	"gorm.io/gorm"
)

// Stock is the GORM model of a stock row.
type Stock struct {
	ID     int64
	SKU    string `gorm:"column:sku"`
	Qty    int
	Batch  string
	Writer string
}

// TableName is the table Schema creates.
func (Stock) TableName() string { return "stock" }

// GORMWorker syncs batches with GORM. sqlfence hands fn a *sql.Tx; onTx
// gives GORM a session on it, the way GORM's own Transaction does (its
// ConnPool is the transaction), so GORM neither begins nor commits.
type GORMWorker struct {
	DB    *gorm.DB
	Store *sqlfence.Store
	Name  string
}

// NewGORMWorker returns a worker over db, a GORM DB on a database/sql
// connection pool (gorm.io/driver/postgres).
func NewGORMWorker(db *gorm.DB, name string) (*GORMWorker, error) {
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	s, err := sqlfence.New(sqlDB)
	if err != nil {
		return nil, err
	}
	return &GORMWorker{DB: db, Store: s, Name: name}, nil
}

// onTx is a GORM session that runs its statements in tx.
func (w *GORMWorker) onTx(ctx context.Context, tx *sql.Tx) *gorm.DB {
	g := w.DB.Session(&gorm.Session{NewDB: true, Context: ctx, SkipDefaultTransaction: true})
	g.Statement.ConnPool = tx
	return g
}

// Sync writes b under lease, once (see SQLXWorker.Sync for the errors).
func (w *GORMWorker) Sync(ctx context.Context, lease guard.Lease, b Batch) error {
	_, err := guard.Exec(ctx, w.Store, lease, func(ctx context.Context, tx *sql.Tx) error {
		rows := make([]Stock, len(b.Rows))
		for i, r := range b.Rows {
			rows[i] = Stock{SKU: r.SKU, Qty: r.Qty, Batch: b.ID, Writer: w.Name}
		}
		return w.onTx(ctx, tx).Create(&rows).Error
	}, guard.WithKey(b.ID))
	return err
}
