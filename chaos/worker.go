package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// WorkerEnv is the environment variable that turns a process into a chaos
// worker: it holds the worker's configuration as JSON. The suite re-executes
// its own binary (the test binary, or cmd/chaos) with it set.
const WorkerEnv = "FENCE_CHAOS_WORKER"

// IsWorker reports whether this process was started as a chaos worker.
func IsWorker() bool { return os.Getenv(WorkerEnv) != "" }

// workerConfig is what the parent tells a worker.
type workerConfig struct {
	ID        int    `json:"id"`
	RedisAddr string `json:"redis"` // a fault proxy in front of Redis
	// ClusterAddrs, for a cluster run, are the nodes' real addresses (what
	// the cluster announces); NodeProxies maps each to this worker's fault
	// proxy in front of it, which the client dials instead.
	ClusterAddrs []string          `json:"cluster,omitempty"`
	NodeProxies  map[string]string `json:"node_proxies,omitempty"`
	PGURL        string            `json:"pg"` // through a fault proxy in front of Postgres
	Prefix       string            `json:"prefix"`
	Resources    []string          `json:"resources"`
	Lease        time.Duration     `json:"lease"`
	Guard        bool              `json:"guard"`
	Seed         uint64            `json:"seed"`
	Think        time.Duration     `json:"think"`        // pause inside the critical section, between read and write
	OpsPerHold   int               `json:"ops_per_hold"` // operations per acquisition
	Items        int               `json:"items"`        // business rows per batch
	// BareLease hands guard.Exec only the lease's name, token and holder,
	// not the lock itself: guard then cannot stop early when the lock is
	// lost, and the database's token check alone must reject stale writes.
	BareLease bool `json:"bare_lease"`
	// IdleTimeout, when set, is given to pgstore.WithIdleTimeout.
	IdleTimeout time.Duration `json:"idle_timeout"`
	// Contender waits with a short random limit (lease/4 to 2 leases)
	// instead of 3 leases: its waits often end while a handover races
	// them.
	Contender bool `json:"contender"`
}

// bareLease is a guard.Lease without Done or Err.
type bareLease struct {
	name, holder string
	token        int64
}

func (b bareLease) Name() string   { return b.name }
func (b bareLease) Token() int64   { return b.token }
func (b bareLease) Holder() string { return b.holder }

// WorkerMain runs a chaos worker configured by WorkerEnv and returns the
// process exit code. The worker stops when its stdin closes.
func WorkerMain() int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(WorkerEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "chaos worker: bad %s: %v\n", WorkerEnv, err)
		return 2
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() {
		// The parent closes our stdin to stop us.
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	w := &worker{cfg: cfg, out: os.Stdout, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.ID)))}
	if err := w.run(ctx); err != nil {
		w.emit(Event{Type: evLog, Err: err.Error()})
		fmt.Fprintf(os.Stderr, "chaos worker %d: %v\n", cfg.ID, err)
		return 1
	}
	return 0
}

type worker struct {
	cfg   workerConfig
	mu    sync.Mutex // serialises writes to out: one event, one write
	out   io.Writer
	rng   *rand.Rand
	seq   int
	pool  *pgxpool.Pool
	store *pgfence.Store
	// pending holds, per resource, a batch whose append ended in an
	// unknown outcome: it is retried with the same idempotency key, as a
	// careful batch job would.
	pending map[string]int64
}

func (w *worker) emit(e Event) {
	if e.At == 0 {
		e.At = time.Now().UnixNano()
	}
	e.Worker = w.cfg.ID
	b, _ := json.Marshal(e)
	b = append(b, '\n')
	w.mu.Lock()
	_, _ = w.out.Write(b)
	w.mu.Unlock()
}

func (w *worker) run(ctx context.Context) error {
	lease := w.cfg.Lease
	var rdb redis.UniversalClient
	if len(w.cfg.ClusterAddrs) > 0 {
		// go-redis defaults otherwise (no ClusterStateReloadInterval):
		// following a failover is fence's job.
		var d net.Dialer
		rdb = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: w.cfg.ClusterAddrs, DialTimeout: lease / 2, ReadTimeout: lease / 3, WriteTimeout: lease / 3,
			ContextTimeoutEnabled: true, MaxRetries: 1, PoolSize: 4,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if p, ok := w.cfg.NodeProxies[addr]; ok {
					addr = p
				}
				return d.DialContext(ctx, network, addr)
			},
		})
	} else {
		rdb = redis.NewClient(&redis.Options{
			Addr: w.cfg.RedisAddr, DialTimeout: lease / 2, ReadTimeout: lease / 3, WriteTimeout: lease / 3,
			ContextTimeoutEnabled: true, MaxRetries: 1, PoolSize: 4,
		})
	}
	defer rdb.Close()
	// A waiter's liveness of one lease: a worker killed while it waits
	// delays the others about as long as one killed while it holds.
	fc, err := fence.New(rdb, fence.WithPrefix(w.cfg.Prefix), fence.WithLease(lease), fence.WithLiveness(lease))
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = fc.Close(cctx)
		cancel()
	}()
	pcfg, err := pgxpool.ParseConfig(w.cfg.PGURL)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 4
	pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
	w.pool, err = pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer w.pool.Close()
	var sopts []pgstore.Option
	if w.cfg.IdleTimeout > 0 {
		sopts = append(sopts, pgstore.WithIdleTimeout(w.cfg.IdleTimeout))
	}
	if w.store, err = pgfence.New(w.pool, sopts...); err != nil {
		return err
	}
	w.pending = map[string]int64{}
	w.emit(Event{Type: evReady})

	for ctx.Err() == nil {
		res := w.cfg.Resources[w.rng.IntN(len(w.cfg.Resources))]
		limit := 3 * lease
		if w.cfg.Contender {
			limit = lease/4 + time.Duration(w.rng.Int64N(int64(7*lease/4)))
		}
		actx, cancel := context.WithTimeout(ctx, limit)
		l, err := fc.Acquire(actx, res)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				sleepCtx(ctx, lease/10)
			}
			continue
		}
		w.hold(ctx, l)
	}
	return nil
}

// hold does a few operations under one acquisition, then releases.
func (w *worker) hold(ctx context.Context, l *fence.Lock) {
	res, tok := l.Name(), l.Token()
	w.emit(Event{Type: evAcquire, Resource: res, Token: tok})
	released := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		// Records the moment the lock's context ends while we still meant
		// to hold it: the loss detection the nemesis measures.
		defer close(watched)
		select {
		case <-l.Done():
			e := Event{Type: evLost, Resource: res, Token: tok}
			if err := l.Err(); err != nil {
				e.Err = err.Error()
			}
			w.emit(e)
		case <-released:
		}
	}()
	for i := 0; i < w.cfg.OpsPerHold && ctx.Err() == nil && l.Err() == nil; i++ {
		if w.rng.IntN(2) == 0 {
			w.incr(l)
		} else {
			w.appendBatch(l)
		}
		sleepCtx(ctx, w.cfg.Think/2)
	}
	close(released)
	<-watched
	rctx, cancel := context.WithTimeout(context.Background(), w.cfg.Lease)
	err := l.Release(rctx)
	cancel()
	e := Event{Type: evRelease, Resource: res, Token: tok}
	if err != nil {
		e.Err = err.Error()
	}
	w.emit(e)
}

func (w *worker) nextOp() string {
	w.seq++
	return "w" + strconv.Itoa(w.cfg.ID) + "-" + strconv.Itoa(w.seq)
}

// opCtx bounds one operation. It is deliberately not the lock's context:
// whatever the client side notices, the database must be what stops a
// stale write. (guard.Exec still watches the lease on its own.)
func (w *worker) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 4*w.cfg.Lease)
}

func (w *worker) think(ctx context.Context) {
	sleepCtx(ctx, w.cfg.Think/2+time.Duration(w.rng.Int64N(int64(w.cfg.Think)+1)))
}

// incr is the read-modify-write: read the register, think, write value+1.
func (w *worker) incr(l *fence.Lock) {
	id := w.nextOp()
	res, tok := l.Name(), l.Token()
	w.emit(Event{Type: evInvoke, Op: id, Kind: KindIncr, Resource: res, Token: tok})
	ctx, cancel := w.opCtx()
	defer cancel()
	var wrote int64
	err := w.write(ctx, l, "", func(ctx context.Context, tx pgx.Tx) error {
		var v int64
		if err := tx.QueryRow(ctx, `SELECT value FROM chaos_register WHERE resource = $1`, res).Scan(&v); err != nil {
			return err
		}
		w.think(ctx)
		wrote = v + 1
		var ver int64
		if err := tx.QueryRow(ctx, `UPDATE chaos_register SET value = $2, version = version + 1 WHERE resource = $1 RETURNING version`,
			res, wrote).Scan(&ver); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO chaos_log (resource, version, kind, token, op_id, value, worker) VALUES ($1,$2,$3,$4,$5,$6,$7)`,
			res, ver, KindIncr, tok, id, wrote, w.cfg.ID)
		return err
	})
	w.complete(id, err, wrote)
}

// appendBatch picks the next batch (or retries a pending one), thinks, and
// inserts its business rows under the batch's idempotency key.
func (w *worker) appendBatch(l *fence.Lock) {
	res, tok := l.Name(), l.Token()
	ctx, cancel := w.opCtx()
	defer cancel()
	batch, retry := w.pending[res]
	if !retry {
		// Read where the job stands, as a stock-sync would read its cursor.
		if err := w.pool.QueryRow(ctx, `SELECT coalesce(max(batch), 0) + 1 FROM chaos_log WHERE resource = $1 AND kind = 'append'`,
			res).Scan(&batch); err != nil {
			return // nothing written, nothing to record
		}
	}
	id := w.nextOp()
	w.emit(Event{Type: evInvoke, Op: id, Kind: KindAppend, Resource: res, Token: tok, Batch: batch})
	w.think(ctx)
	err := w.write(ctx, l, res+"/batch-"+strconv.FormatInt(batch, 10), func(ctx context.Context, tx pgx.Tx) error {
		var ver int64
		if err := tx.QueryRow(ctx, `UPDATE chaos_register SET version = version + 1 WHERE resource = $1 RETURNING version`,
			res).Scan(&ver); err != nil {
			return err
		}
		for i := 0; i < w.cfg.Items; i++ {
			if _, err := tx.Exec(ctx, `INSERT INTO chaos_items (resource, batch, item, token) VALUES ($1,$2,$3,$4)`,
				res, batch, i, tok); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO chaos_log (resource, version, kind, token, op_id, batch, worker) VALUES ($1,$2,$3,$4,$5,$6,$7)`,
			res, ver, KindAppend, tok, id, batch, w.cfg.ID)
		return err
	})
	if classify(err) == OutFail {
		w.pending[res] = batch
	} else {
		delete(w.pending, res)
	}
	w.complete(id, err, 0)
}

// write runs fn fenced by guard (guard on) or in a plain transaction under
// the lock (the control: the lock alone).
func (w *worker) write(ctx context.Context, l *fence.Lock, key string, fn func(context.Context, pgx.Tx) error) error {
	if w.cfg.Guard {
		var opts []guard.Option
		if key != "" {
			opts = append(opts, guard.WithKey(key))
		}
		var lease guard.Lease = l
		if w.cfg.BareLease {
			lease = bareLease{name: l.Name(), holder: l.Holder(), token: l.Token()}
		}
		_, err := guard.Exec(ctx, w.store, lease, fn, opts...)
		return err
	}
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error { return fn(ctx, tx) })
}

func classify(err error) Outcome {
	switch {
	case err == nil:
		return OutOK
	case errors.Is(err, guard.ErrStaleToken):
		return OutStale
	case errors.Is(err, guard.ErrAlreadyApplied):
		return OutDup
	}
	// Anything else (lease lost, connection broken, timeout) may have
	// happened before, during or after COMMIT: the database decides.
	return OutFail
}

func (w *worker) complete(id string, err error, val int64) {
	e := Event{Type: evComplete, Op: id, Outcome: classify(err)}
	if err != nil {
		e.Err = err.Error()
	} else {
		e.Value = val
	}
	w.emit(e)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
