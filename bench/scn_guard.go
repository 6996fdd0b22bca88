package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
)

// pgDB is a fresh database with the fencelock schema, reachable directly
// and through a fault proxy.
type pgDB struct {
	name    string
	url     string
	direct  *pgxpool.Pool
	proxied *pgxpool.Pool
	proxy   *testenv.Proxy
}

func (e *env) newPGDB(ctx context.Context, withProxy bool) (*pgDB, error) {
	if e.pg == nil {
		return nil, fmt.Errorf("postgres was not started")
	}
	name, url, err := e.pg.CreateDatabase(ctx)
	if err != nil {
		return nil, err
	}
	d := &pgDB{name: name, url: url}
	if d.direct, err = pgxpool.New(ctx, url); err != nil {
		return nil, err
	}
	sqlDB := stdlib.OpenDBFromPool(d.direct)
	err = migrations.Up(ctx, sqlDB)
	_ = sqlDB.Close()
	if err != nil {
		d.close(ctx, e)
		return nil, fmt.Errorf("migrations.Up: %w", err)
	}
	if withProxy {
		if d.proxy, err = testenv.NewProxy(e.pg.Addr); err != nil {
			d.close(ctx, e)
			return nil, err
		}
		if d.proxied, err = pgxpool.New(ctx, strings.Replace(url, e.pg.Addr, d.proxy.Addr, 1)); err != nil {
			d.close(ctx, e)
			return nil, err
		}
	}
	return d, nil
}

func (d *pgDB) close(ctx context.Context, e *env) {
	if d.proxied != nil {
		d.proxied.Close()
	}
	if d.proxy != nil {
		_ = d.proxy.Close()
	}
	if d.direct != nil {
		d.direct.Close()
	}
	_ = e.pg.DropDatabase(context.WithoutCancel(ctx), d.name)
}

const guardInsert = `INSERT INTO bench_rows (resource, qty) VALUES ($1, $2)`

func runGuard(ctx context.Context, e *env, res *results) error {
	s := res.scenario("guard")
	db, err := e.newPGDB(ctx, true)
	if err != nil {
		return err
	}
	defer db.close(ctx, e)
	if _, err := db.direct.Exec(ctx, `CREATE TABLE bench_rows (id bigserial PRIMARY KEY, resource text NOT NULL, qty int NOT NULL, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	lock, err := e.fence.c.Acquire(ctx, "guard-bench")
	if err != nil {
		return err
	}
	defer lock.Release(context.WithoutCancel(ctx)) //nolint:errcheck

	var keySeq atomic.Int64
	variants := func(pool *pgxpool.Pool, store *pgfence.Store) []op {
		return []op{
			{"plain", func(ctx context.Context) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, guardInsert, "guard-bench", 1)
					return err
				})
			}},
			{"guarded", func(ctx context.Context) error {
				_, err := guard.Exec(ctx, store, lock, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, guardInsert, "guard-bench", 1)
					return err
				})
				return err
			}},
			{"guarded+key", func(ctx context.Context) error {
				k := "k-" + strconv.FormatInt(keySeq.Add(1), 10)
				_, err := guard.Exec(ctx, store, lock, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, guardInsert, "guard-bench", 1)
					return err
				}, guard.WithKey(k))
				return err
			}},
		}
	}
	for _, path := range []struct {
		name string
		pool *pgxpool.Pool
		n    int
	}{{"direct", db.direct, e.cfg.GuardTxDirect}, {"proxied 1ms each way", db.proxied, e.cfg.GuardTxProxied}} {
		store, err := pgfence.New(path.pool)
		if err != nil {
			return err
		}
		if path.pool == db.proxied {
			db.proxy.Delay(e.cfg.ProxyDelay)
		}
		repMed, pooled, err := interleaved(ctx, e.cfg.Reps, path.n, variants(path.pool, store))
		if err != nil {
			return fmt.Errorf("%s: %w", path.name, err)
		}
		for _, v := range []string{"plain", "guarded", "guarded+key"} {
			s.set(path.name+": "+v, "tx_latency_us", newFigure("µs", repMed[v], pooled[v]))
		}
		s.Ratios["guarded/plain "+path.name] = pairedRatio(repMed["guarded"], repMed["plain"])
		s.Ratios["guarded+key/plain "+path.name] = pairedRatio(repMed["guarded+key"], repMed["plain"])
	}
	if err := lock.Err(); err != nil {
		return fmt.Errorf("the lease was lost during the scenario: %w", err)
	}
	s.Notes = append(s.Notes,
		"one-row write transaction (BEGIN; INSERT; COMMIT) on one connection: plain = pgx.BeginFunc; guarded = guard.Exec with a fence lock as the lease (pgfence on a pgxpool); guarded+key adds guard.WithKey with a new key per transaction. Variants interleave in blocks of 50 within each repetition.",
		fmt.Sprintf("proxied: through testenv's fault proxy with Delay(%v) each way (the proxy runs in the bench process, on the client CPU).", e.cfg.ProxyDelay))
	return nil
}

var _ guard.Lease = (*fence.Lock)(nil)
