package main

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync/atomic"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "github.com/lib/pq"              // database/sql driver "postgres"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/sqlfence"
)

// runSQLFence times a one-row write transaction over database/sql, plain
// and through sqlfence, with pgx's database/sql driver and with lib/pq,
// on one connection each.
func runSQLFence(ctx context.Context, e *env, res *results) error {
	s := res.scenario("sqlfence")
	db, err := e.newPGDB(ctx, false)
	if err != nil {
		return err
	}
	defer db.close(ctx, e)
	if _, err := db.direct.Exec(ctx, `CREATE TABLE bench_rows (id bigserial PRIMARY KEY, resource text NOT NULL, qty int NOT NULL, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	lock, err := e.fence.c.Acquire(ctx, "sqlfence-bench")
	if err != nil {
		return err
	}
	defer lock.Release(context.WithoutCancel(ctx)) //nolint:errcheck

	var keySeq atomic.Int64
	insert := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, guardInsert, "sqlfence-bench", 1)
		return err
	}
	for _, driver := range []string{"pgx", "postgres"} {
		sdb, err := sql.Open(driver, db.url)
		if err != nil {
			return err
		}
		defer sdb.Close()
		sdb.SetMaxOpenConns(1)
		store, err := sqlfence.New(sdb)
		if err != nil {
			return err
		}
		ops := []op{
			{"plain", func(ctx context.Context) error {
				tx, err := sdb.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				if err := insert(ctx, tx); err != nil {
					_ = tx.Rollback()
					return err
				}
				return tx.Commit()
			}},
			{"guarded", func(ctx context.Context) error {
				_, err := guard.Exec(ctx, store, lock, insert)
				return err
			}},
			{"guarded+key", func(ctx context.Context) error {
				_, err := guard.Exec(ctx, store, lock, insert, guard.WithKey("k-"+strconv.FormatInt(keySeq.Add(1), 10)))
				return err
			}},
		}
		repMed, pooled, err := interleaved(ctx, e.cfg.Reps, e.cfg.GuardTxDirect, ops)
		if err != nil {
			return fmt.Errorf("%s: %w", driver, err)
		}
		for _, v := range []string{"plain", "guarded", "guarded+key"} {
			s.set(driver+": "+v, "tx_latency_us", newFigure("µs", repMed[v], pooled[v]))
		}
		s.Ratios["guarded/plain "+driver] = pairedRatio(repMed["guarded"], repMed["plain"])
		s.Ratios["guarded+key/plain "+driver] = pairedRatio(repMed["guarded+key"], repMed["plain"])
	}
	if err := lock.Err(); err != nil {
		return fmt.Errorf("the lease was lost during the scenario: %w", err)
	}
	s.Notes = append(s.Notes,
		"one-row write transaction over database/sql on one connection, with pgx's driver (\"pgx\") and lib/pq (\"postgres\"): plain = BeginTx, INSERT, Commit (3 round trips); guarded = guard.Exec through sqlfence with a fence lock as the lease (5 round trips: database/sql sends BEGIN and COMMIT itself, so the check after BEGIN and the claim before COMMIT are a statement each); guarded+key adds a new guard.WithKey per transaction. Variants interleave in blocks of 50 within each repetition.")
	return nil
}
