package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
			{"floor", func(ctx context.Context) error {
				return floorTx(ctx, pool)
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
		for _, v := range []string{"plain", "floor", "guarded", "guarded+key"} {
			s.set(path.name+": "+v, "tx_latency_us", newFigure("µs", repMed[v], pooled[v]))
		}
		s.Ratios["floor/plain "+path.name] = pairedRatio(repMed["floor"], repMed["plain"])
		s.Ratios["guarded/plain "+path.name] = pairedRatio(repMed["guarded"], repMed["plain"])
		s.Ratios["guarded+key/plain "+path.name] = pairedRatio(repMed["guarded+key"], repMed["plain"])
		s.Ratios["guarded/floor "+path.name] = pairedRatio(repMed["guarded"], repMed["floor"])
		s.Ratios["guarded+key/floor "+path.name] = pairedRatio(repMed["guarded+key"], repMed["floor"])
	}
	if err := profileGuard(ctx, e, db, s, variants); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	if err := lock.Err(); err != nil {
		return fmt.Errorf("the lease was lost during the scenario: %w", err)
	}
	s.Notes = append(s.Notes,
		"one-row write transaction (BEGIN; INSERT; COMMIT) on one connection: plain = pgx.BeginFunc; floor = the plain transaction with a prepared no-op statement (SELECT 1) added to its BEGIN and to its COMMIT round trip, BEGIN and COMMIT prepared too: what two statements more and no round trip more, the guarded transaction's shape, cost at the least (floor/plain is the best guarded/plain this shape can reach on the machine); guarded = guard.Exec with a fence lock as the lease (pgfence on a pgxpool); guarded+key adds guard.WithKey with a new key per transaction. Variants interleave in blocks of 50 within each repetition.",
		fmt.Sprintf("proxied: through testenv's fault proxy with Delay(%v) each way (the proxy runs in the bench process, on the client CPU).", e.cfg.ProxyDelay))
	return nil
}

var _ guard.Lease = (*fence.Lock)(nil)

// floorTx is the plain one-row transaction in the guarded transaction's
// shape: BEGIN with a prepared SELECT 1 in one round trip, the INSERT,
// then a prepared SELECT 1 with COMMIT in one round trip. Statements are
// prepared once per connection, as pgfence's are.
func floorTx(ctx context.Context, pool *pgxpool.Pool) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	for _, st := range [][2]string{{"bench_floor_begin", "BEGIN ISOLATION LEVEL READ COMMITTED"}, {"bench_floor_noop", "SELECT 1"}, {"bench_floor_commit", "COMMIT"}} {
		if _, err := c.Conn().Prepare(ctx, st[0], st[1]); err != nil {
			return err
		}
	}
	pc := c.Conn().PgConn()
	trip := func(names ...string) error {
		p := pc.StartPipeline(ctx)
		for _, n := range names {
			p.SendQueryPrepared(n, nil, nil, nil)
		}
		p.SendPipelineSync()
		if err := p.Flush(); err != nil {
			_ = p.Close()
			return err
		}
		for range names {
			r, err := p.GetResults()
			if err != nil {
				_ = p.Close()
				return err
			}
			if rr, ok := r.(*pgconn.ResultReader); ok {
				if _, err := rr.Close(); err != nil {
					_ = p.Close()
					return err
				}
			}
		}
		return p.Close()
	}
	if err := trip("bench_floor_begin", "bench_floor_noop"); err != nil {
		return err
	}
	if _, err := c.Conn().Exec(ctx, guardInsert, "guard-bench", 1); err != nil {
		_, _ = c.Conn().Exec(ctx, "ROLLBACK")
		return err
	}
	return trip("bench_floor_noop", "bench_floor_commit")
}

// profileGuard says where a guarded transaction's time goes: on one
// connection, per transaction of each variant, the CPU time its server
// process spent (from /proc/<backend pid>/schedstat, nanoseconds) and the
// round trips on the wire (the client's writes: pgx and pgfence send each
// round trip in one write).
func profileGuard(ctx context.Context, e *env, db *pgDB, s *scenario, variants func(*pgxpool.Pool, *pgfence.Store) []op) error {
	var writes atomic.Int64
	cfg, err := pgxpool.ParseConfig(db.url)
	if err != nil {
		return err
	}
	cfg.MaxConns, cfg.MinConns = 1, 1
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{Conn: c, writes: &writes}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	var pid int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return err
	}
	store, err := pgfence.New(pool)
	if err != nil {
		return err
	}
	ops := variants(pool, store)
	n := max(e.cfg.GuardTxDirect/2, 10)
	cpu := map[string][]float64{}
	trips := map[string][]float64{}
	client := map[string][]float64{}
	wall := map[string][]float64{}
	for rep := 0; rep < e.cfg.Reps; rep++ {
		for i := range ops {
			o := ops[(i+rep)%len(ops)]
			for range 20 { // warm-up
				if err := o.do(ctx); err != nil {
					return err
				}
			}
			c0, err := schedRuntime(pid)
			if err != nil {
				return err
			}
			w0, u0, t0 := writes.Load(), cpuTime(), time.Now()
			for range n {
				if err := o.do(ctx); err != nil {
					return err
				}
			}
			c1, err := schedRuntime(pid)
			if err != nil {
				return err
			}
			client[o.name] = append(client[o.name], (cpuTime()-u0)*1e6/float64(n))
			wall[o.name] = append(wall[o.name], us(time.Since(t0))/float64(n))
			cpu[o.name] = append(cpu[o.name], float64(c1-c0)/1e3/float64(n))
			trips[o.name] = append(trips[o.name], float64(writes.Load()-w0)/float64(n))
		}
	}
	for _, v := range []string{"plain", "floor", "guarded", "guarded+key"} {
		s.set("profile: "+v, "server_cpu_us_per_tx", newFigure("µs", cpu[v], nil))
		s.set("profile: "+v, "round_trips_per_tx", newFigure("", trips[v], nil))
		s.set("profile: "+v, "client_cpu_us_per_tx", newFigure("µs", client[v], nil))
		s.set("profile: "+v, "tx_latency_us", newFigure("µs", wall[v], nil))
	}
	s.Ratios["server CPU guarded/plain"] = pairedRatio(cpu["guarded"], cpu["plain"])
	s.Ratios["server CPU floor/plain"] = pairedRatio(cpu["floor"], cpu["plain"])
	s.Ratios["server CPU guarded+key/plain"] = pairedRatio(cpu["guarded+key"], cpu["plain"])
	s.Ratios["server CPU guarded/floor"] = pairedRatio(cpu["guarded"], cpu["floor"])
	s.Notes = append(s.Notes, fmt.Sprintf(
		"profile: one connection, %d transactions per variant per repetition; server_cpu_us_per_tx is the CPU time of the connection's Postgres process per transaction (/proc/<pid>/schedstat), round_trips_per_tx the client's writes per transaction, client_cpu_us_per_tx the bench process's CPU time (getrusage) per transaction, tx_latency_us the mean time per transaction of that run. The guarded transaction's extra server time is its statements: the check at begin (a plain statement reading the fence row, in the BEGIN round trip), and in the COMMIT round trip the shared fence lock and the token read again (a write with a key or a run: fencelock.close, a PL/pgSQL function that also records the key or moves the run) (prepared once per connection, as the bench's connections go straight to Postgres; behind a transaction pooler they are parsed and planned in every transaction)", n))
	return nil
}

// writeCounter counts the client's writes to the server.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// schedRuntime is the CPU time a process has run, in nanoseconds (the
// first field of /proc/<pid>/schedstat).
func schedRuntime(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, fmt.Errorf("server CPU time: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("server CPU time: empty /proc/%d/schedstat", pid)
	}
	return strconv.ParseInt(f[0], 10, 64)
}
