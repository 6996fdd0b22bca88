package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// schema is the target database of the stock sync. stock_records has, on
// purpose, no unique constraint on (warehouse, snapshot_id, sku): that is how
// the duplicates got in before, and fencing must keep them out anyway.
const schema = `
CREATE TABLE IF NOT EXISTS source_stock (
	warehouse   text   NOT NULL,
	snapshot_id text   NOT NULL,
	sku         text   NOT NULL,
	qty         int    NOT NULL,
	PRIMARY KEY (warehouse, snapshot_id, sku)
);
CREATE TABLE IF NOT EXISTS stock_records (
	id          bigserial   PRIMARY KEY,
	warehouse   text        NOT NULL,
	snapshot_id text        NOT NULL,
	sku         text        NOT NULL,
	qty         int         NOT NULL,
	worker      text        NOT NULL,
	token       bigint      NOT NULL,
	written_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- The old job's "done" marker: checked at the start, set at the end.
CREATE TABLE IF NOT EXISTS sync_batches (
	warehouse   text NOT NULL,
	snapshot_id text NOT NULL,
	done_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
	PRIMARY KEY (warehouse, snapshot_id)
);
-- What each worker did, for the demo's timeline and counts. A chunk's
-- "committed" row is written in the chunk's own transaction, so it exists
-- exactly when the chunk's rows do.
CREATE TABLE IF NOT EXISTS sync_log (
	id        bigserial   PRIMARY KEY,
	at        timestamptz NOT NULL DEFAULT clock_timestamp(),
	run       text        NOT NULL,
	worker    text        NOT NULL,
	token     bigint      NOT NULL DEFAULT 0,
	event     text        NOT NULL,
	chunk     int         NOT NULL DEFAULT -1,
	detail    text        NOT NULL DEFAULT ''
);
-- What the demo's receiver (the marketplace API) got: one row per push.
CREATE TABLE IF NOT EXISTS effects_received (
	id        bigserial   PRIMARY KEY,
	at        timestamptz NOT NULL DEFAULT clock_timestamp(),
	run       text        NOT NULL,
	key       text        NOT NULL,
	worker    text        NOT NULL,
	token     bigint      NOT NULL,
	chunk     int         NOT NULL,
	skus      int         NOT NULL
);
`

// installSchema creates the demo's tables.
func installSchema(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, schema+tickSchema); err != nil {
		return fmt.Errorf("inventory-sync: create tables: %w", err)
	}
	return nil
}

// seedSnapshot writes a deterministic source snapshot of n SKUs.
func seedSnapshot(ctx context.Context, pool *pgxpool.Pool, warehouse, snapshot string, n int) error {
	_, err := pool.Exec(ctx, `
		INSERT INTO source_stock (warehouse, snapshot_id, sku, qty)
		SELECT $1, $2, format('SKU-%s', lpad(i::text, 5, '0')), (i * 7919) % 500
		FROM generate_series(1, $3::int) AS i
		ON CONFLICT DO NOTHING`, warehouse, snapshot, n)
	if err != nil {
		return fmt.Errorf("inventory-sync: seed snapshot: %w", err)
	}
	return nil
}
