package inventory

import (
	"context"
	"database/sql"
	"fmt"
)

// Schema is the stock table both workers write to.
const Schema = `CREATE TABLE IF NOT EXISTS stock (
    id     bigserial PRIMARY KEY,
    sku    text   NOT NULL,
    qty    int    NOT NULL,
    batch  text   NOT NULL,
    writer text   NOT NULL
)`

// CreateSchema creates the stock table.
func CreateSchema(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, Schema); err != nil {
		return fmt.Errorf("inventory: create stock table: %w", err)
	}
	return nil
}

// Batch is one unit of the sync: the rows of one upstream export, applied
// at most once (ID is the idempotency key).
type Batch struct {
	ID   string
	Rows []Row
}

// Row is one stock row of a batch.
type Row struct {
	SKU string `db:"sku"`
	Qty int    `db:"qty"`
}
