package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/pgfence"
)

// Config is one worker's settings (the flags of `inventory-sync worker`).
type Config struct {
	Run        string        // label of the demo run, for the log
	Name       string        // worker name, e.g. "A"
	Warehouse  string        // lock name is "stock-sync:<warehouse>"
	Snapshot   string        // source snapshot id; batch identity = warehouse + snapshot
	Lease      time.Duration // lock lease
	Watchdog   bool          // renew the lease while working (false: fixed lease)
	Guard      bool          // write through guard (fencing + resumable run)
	ChunkSize  int           // rows per write transaction
	ChunkDelay time.Duration // time each chunk takes before its write ("the database is slow today")
	RedisURL   string
	DBURL      string
	// FreezeAt, when >= 0, makes the worker stop itself with SIGSTOP in the
	// middle of writing that chunk (after its inserts, before its commit):
	// the worst moment for a GC pause or a frozen VM. Something else must
	// SIGCONT it. For the demo's "pause" scenario.
	FreezeAt int
	// FreezeBeforeCommitAt, when >= 0, makes the worker stop itself with
	// SIGSTOP when that chunk's commit is about to go out: after fn
	// returned and after guard's last look at the lease, just before the
	// COMMIT round trip is written to the socket (a GC pause at the worst
	// moment). Only the database can refuse that commit. For the demo's
	// "precommit" scenario.
	FreezeBeforeCommitAt int
	// EffectsURL, when set, is where each committed chunk's stock levels
	// are pushed (the marketplace API of the incident): guard off, by a
	// POST right after the chunk's commit; guard on, through the outbox,
	// recorded in the chunk's transaction and sent by a relay.
	EffectsURL string
}

// row is one SKU quantity of the source snapshot.
type row struct {
	SKU string
	Qty int32
}

// Worker is a stock-sync worker: it copies a source snapshot into
// stock_records under the lock stock-sync:<warehouse>.
type Worker struct {
	cfg   Config
	pool  *pgxpool.Pool
	locks *fence.Client
	store *pgfence.Store
	out   *json.Encoder
}

// NewWorker connects to Redis and Postgres.
func NewWorker(ctx context.Context, cfg Config, rdb redis.UniversalClient, pool *pgxpool.Pool) (*Worker, error) {
	if cfg.ChunkSize <= 0 {
		return nil, fmt.Errorf("inventory-sync: chunk size must be positive, got %d", cfg.ChunkSize)
	}
	locks, err := fence.New(rdb)
	if err != nil {
		return nil, err
	}
	store, err := pgfence.New(pool)
	if err != nil {
		_ = locks.Close(ctx)
		return nil, err
	}
	return &Worker{cfg: cfg, pool: pool, locks: locks, store: store, out: json.NewEncoder(os.Stdout)}, nil
}

// Close releases what the worker holds.
func (w *Worker) Close(ctx context.Context) error { return w.locks.Close(ctx) }

func (w *Worker) lockOptions() []fence.LockOption {
	if w.cfg.Watchdog {
		return []fence.LockOption{fence.WithLease(w.cfg.Lease)}
	}
	return []fence.LockOption{fence.WithFixedLease(w.cfg.Lease)}
}

// Run syncs the snapshot once, the fencelock way or the old way.
func (w *Worker) Run(ctx context.Context) error {
	rows, err := w.readSnapshot(ctx)
	if err != nil {
		return err
	}
	if w.cfg.Guard {
		return w.syncFenced(ctx, rows)
	}
	return w.syncUnfenced(ctx, rows)
}

// syncFenced is the worker as we tell users to write it:
//
//   - work runs under lock.Context(), which is cancelled the moment the lock
//     is lost;
//   - the fence is claimed right after acquiring (Advance), so a former
//     holder that is still paused is rejected before our first write;
//   - the batch is a resumable run keyed by its identity: each chunk is one
//     fenced transaction that also advances the cursor, a new holder resumes
//     where the last one stopped, and a finished batch is never written
//     again;
//   - a late write from a holder whose lock expired is rejected by Postgres
//     (guard.ErrStaleToken), whatever the holder believes.
func (w *Worker) syncFenced(ctx context.Context, rows []row) error {
	lock, err := w.locks.Acquire(ctx, "stock-sync:"+w.cfg.Warehouse, w.lockOptions()...)
	if err != nil {
		return err
	}
	defer lock.Release(ctx) //nolint:errcheck // ErrNotHeld after a loss is expected
	w.event(lock.Token(), "acquired", -1, "")

	if err := w.store.Advance(ctx, lock); err != nil {
		return w.fail(lock.Token(), -1, err)
	}
	run := w.store.Run(lock, "stock-sync:"+w.cfg.Warehouse+":"+w.cfg.Snapshot)
	cursor, finished, err := run.Resume(ctx)
	if err != nil {
		return w.fail(lock.Token(), -1, err)
	}
	if finished {
		w.event(lock.Token(), "skipped", -1, "batch already finished")
		return nil
	}
	next := 0
	if cursor != "" {
		if next, err = strconv.Atoi(cursor); err != nil {
			return fmt.Errorf("inventory-sync: bad cursor %q: %w", cursor, err)
		}
		w.event(lock.Token(), "resumed", next, "")
	}
	work := lock.Context() // cancelled when the lock is lost
	for chunk := next; chunk*w.cfg.ChunkSize < len(rows); chunk++ {
		part := w.chunk(rows, chunk)
		if err := w.slowDown(work); err != nil {
			return w.fail(lock.Token(), chunk, context.Cause(work))
		}
		err := run.Step(work, strconv.Itoa(chunk+1), func(ctx context.Context, tx pgx.Tx) error {
			if err := w.writeChunk(ctx, tx, lock.Token(), chunk, part); err != nil {
				return err
			}
			if w.cfg.EffectsURL == "" {
				return nil
			}
			// The push goes out only if this transaction commits, and
			// carries the token the receiver can fence with.
			return outbox.Add(ctx, tx, outbox.Effect{
				Destination: w.cfg.EffectsURL, Key: w.effectKey(chunk), Payload: w.effectBody(lock.Token(), chunk, part),
				Header: http.Header{"Content-Type": {"application/json"}},
			})
		})
		if err != nil {
			return w.failWrite(lock.Token(), chunk, err)
		}
		w.progress(lock.Token(), chunk)
	}
	if err := run.Finish(ctx); err != nil {
		return w.fail(lock.Token(), -1, err)
	}
	w.event(lock.Token(), "finished", -1, "")
	return nil
}

// syncUnfenced is the job as it was before fencelock: a lock around the
// work, a "done" marker checked at the start, plain transactions, and no
// way for the database to tell a current holder from one whose lock
// expired. It is here to reproduce the incident.
func (w *Worker) syncUnfenced(ctx context.Context, rows []row) error {
	lock, err := w.locks.Acquire(ctx, "stock-sync:"+w.cfg.Warehouse, w.lockOptions()...)
	if err != nil {
		return err
	}
	defer lock.Release(ctx) //nolint:errcheck
	w.event(lock.Token(), "acquired", -1, "")

	var done bool
	err = w.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sync_batches WHERE warehouse = $1 AND snapshot_id = $2)`,
		w.cfg.Warehouse, w.cfg.Snapshot).Scan(&done)
	if err != nil {
		return w.fail(lock.Token(), -1, err)
	}
	if done {
		w.event(lock.Token(), "skipped", -1, "batch already done")
		return nil
	}
	// The old job never looked at the lock again once it had it.
	for chunk := 0; chunk*w.cfg.ChunkSize < len(rows); chunk++ {
		part := w.chunk(rows, chunk)
		if err := w.slowDown(ctx); err != nil {
			return err
		}
		err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			return w.writeChunk(ctx, tx, lock.Token(), chunk, part)
		})
		if err != nil {
			return w.fail(lock.Token(), chunk, err)
		}
		w.progress(lock.Token(), chunk)
		// The push right after the commit, as the job did before.
		w.pushDirect(ctx, lock.Token(), chunk, part)
	}
	_, err = w.pool.Exec(ctx, `INSERT INTO sync_batches (warehouse, snapshot_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		w.cfg.Warehouse, w.cfg.Snapshot)
	if err != nil {
		return w.fail(lock.Token(), -1, err)
	}
	w.event(lock.Token(), "finished", -1, "")
	return nil
}

func (w *Worker) readSnapshot(ctx context.Context) ([]row, error) {
	rs, err := w.pool.Query(ctx, `SELECT sku, qty FROM source_stock WHERE warehouse = $1 AND snapshot_id = $2 ORDER BY sku`,
		w.cfg.Warehouse, w.cfg.Snapshot)
	if err != nil {
		return nil, fmt.Errorf("inventory-sync: read snapshot: %w", err)
	}
	rows, err := pgx.CollectRows(rs, pgx.RowToStructByPos[row])
	if err != nil {
		return nil, fmt.Errorf("inventory-sync: read snapshot: %w", err)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("inventory-sync: snapshot %s/%s is empty", w.cfg.Warehouse, w.cfg.Snapshot)
	}
	return rows, nil
}

func (w *Worker) chunk(rows []row, i int) []row {
	end := min((i+1)*w.cfg.ChunkSize, len(rows))
	return rows[i*w.cfg.ChunkSize : end]
}

// slowDown spends the per-chunk delay in the database, as a slow source
// query would.
func (w *Worker) slowDown(ctx context.Context) error {
	if w.cfg.ChunkDelay <= 0 {
		return ctx.Err()
	}
	_, err := w.pool.Exec(ctx, `SELECT pg_sleep($1)`, w.cfg.ChunkDelay.Seconds())
	return err
}

// writeChunk inserts one chunk and its log row in the caller's transaction.
func (w *Worker) writeChunk(ctx context.Context, tx pgx.Tx, token int64, chunk int, part []row) error {
	skus := make([]string, len(part))
	qtys := make([]int32, len(part))
	for i, r := range part {
		skus[i], qtys[i] = r.SKU, r.Qty
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO stock_records (warehouse, snapshot_id, sku, qty, worker, token)
		SELECT $1, $2, s, q, $3, $4 FROM unnest($5::text[], $6::int[]) AS u(s, q)`,
		w.cfg.Warehouse, w.cfg.Snapshot, w.cfg.Name, token, skus, qtys)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO sync_log (run, worker, token, event, chunk) VALUES ($1, $2, $3, 'committed', $4)`,
		w.cfg.Run, w.cfg.Name, token, chunk)
	if err == nil && chunk == w.cfg.FreezeAt {
		w.event(token, "frozen", chunk, "SIGSTOP in the middle of the chunk's transaction")
		freeze()
	}
	if err == nil && chunk == w.cfg.FreezeBeforeCommitAt {
		w.event(token, "frozen", chunk, "SIGSTOP just before the chunk's COMMIT goes out")
		freezeBeforeCommit.Store(true) // the commit's write freezes (commitFreezer)
	}
	return err
}

// effectKey identifies a chunk's push: the same for every holder and
// every attempt, so that a receiver can tell a repeat.
func (w *Worker) effectKey(chunk int) string {
	return fmt.Sprintf("stock-sync:%s:%s:chunk-%d", w.cfg.Warehouse, w.cfg.Snapshot, chunk)
}

// effectBody is a chunk's push: its stock levels, and who wrote them.
func (w *Worker) effectBody(token int64, chunk int, part []row) []byte {
	levels := make(map[string]int32, len(part))
	for _, r := range part {
		levels[r.SKU] = r.Qty
	}
	b, _ := json.Marshal(effectBody{Run: w.cfg.Run, Worker: w.cfg.Name, Token: token, Chunk: chunk, Levels: levels})
	return b
}

// effectBody is the JSON of a chunk's push.
type effectBody struct {
	Run    string           `json:"run"`
	Worker string           `json:"worker"`
	Token  int64            `json:"token"`
	Chunk  int              `json:"chunk"`
	Levels map[string]int32 `json:"levels"`
}

var pushClient = &http.Client{Timeout: 5 * time.Second}

// pushDirect POSTs a committed chunk's stock levels to the receiver, the
// way code without fencelock does: after its commit, whoever holds the
// lock by then.
func (w *Worker) pushDirect(ctx context.Context, token int64, chunk int, part []row) {
	if w.cfg.EffectsURL == "" {
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.EffectsURL, bytes.NewReader(w.effectBody(token, chunk, part)))
	if err == nil {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", w.effectKey(chunk))
		var resp *http.Response
		if resp, err = pushClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}
	if err != nil {
		w.event(token, "push_failed", chunk, err.Error())
	}
}

// failWrite logs why a chunk's transaction did not commit. A stale write
// is rejected either by Postgres (the token is older than one it has seen)
// or, earlier, by guard because the lease was lost while the transaction
// was open; nothing of it is committed in both cases.
func (w *Worker) failWrite(token int64, chunk int, err error) error {
	var stale *guard.StaleTokenError
	switch {
	case errors.As(err, &stale):
		w.event(token, "rejected_stale", chunk, fmt.Sprintf("token %d < current %d", stale.Token, stale.Current))
	case errors.Is(err, guard.ErrLeaseLost), errors.Is(err, fence.ErrLockLost), errors.Is(err, context.Canceled):
		w.event(token, "rejected_lease_lost", chunk, err.Error())
	default:
		w.event(token, "error", chunk, err.Error())
	}
	return err
}

// fail logs why the worker stopped (a stale write rejected by the database,
// a lost lock, or another error) and returns err.
func (w *Worker) fail(token int64, chunk int, err error) error {
	var stale *guard.StaleTokenError
	switch {
	case errors.As(err, &stale):
		w.event(token, "rejected_stale", chunk, fmt.Sprintf("token %d < current %d", stale.Token, stale.Current))
	case errors.Is(err, guard.ErrLeaseLost), errors.Is(err, fence.ErrLockLost), errors.Is(err, context.Canceled):
		w.event(token, "stopped_lock_lost", chunk, err.Error())
	default:
		w.event(token, "error", chunk, err.Error())
	}
	return err
}

// event records what happened in sync_log (its own transaction) and on
// stdout for the demo's live progress.
func (w *Worker) event(token int64, event string, chunk int, detail string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = w.pool.Exec(ctx, `INSERT INTO sync_log (run, worker, token, event, chunk, detail) VALUES ($1, $2, $3, $4, $5, $6)`,
		w.cfg.Run, w.cfg.Name, token, event, chunk, detail)
	_ = w.out.Encode(map[string]any{"worker": w.cfg.Name, "event": event, "chunk": chunk, "token": token, "detail": detail})
}

// progress reports a committed chunk on stdout (its log row is already in
// the chunk's transaction).
func (w *Worker) progress(token int64, chunk int) {
	_ = w.out.Encode(map[string]any{"worker": w.cfg.Name, "event": "committed", "chunk": chunk, "token": token})
}

// freeze stops this process with SIGSTOP until something sends SIGCONT.
// The signal is sent to the calling thread, not to the process: a
// process-directed SIGSTOP is taken by whichever thread the kernel picks,
// and on a busy machine this goroutine could run on for milliseconds (and
// commit) before that thread stops the group.
func freeze() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}

// freezeBeforeCommit arms commitFreezer for the next commit.
var freezeBeforeCommit atomic.Bool

// commitFreezer is the worker's connection to Postgres. When armed, it
// stops the process (freeze) on the write that carries the commit round
// trip, before the bytes go out: pgfence's fencelock.close pipeline with
// guard (the statement by its prepared name, fencelock_close_..., or by
// its text behind a pooler), pgx's COMMIT without. Everything client-side (guard's last check
// of the lease included) has run by then.
type commitFreezer struct{ net.Conn }

// commitQuery is pgx's "commit" as a simple-protocol Query message.
var commitQuery = []byte("Q\x00\x00\x00\x0bcommit\x00")

func (c commitFreezer) Write(b []byte) (int, error) {
	if freezeBeforeCommit.Load() && (bytes.Contains(b, []byte("fencelock_close_")) || bytes.Contains(b, []byte("fencelock.close(")) || bytes.HasPrefix(b, commitQuery)) {
		freezeBeforeCommit.Store(false)
		freeze()
	}
	return c.Conn.Write(b)
}

// dialFreezer wraps the pool's connections in commitFreezer.
func dialFreezer(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return commitFreezer{c}, nil
	}
}
