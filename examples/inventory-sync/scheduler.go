package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/tick"
)

// schedulerEnv marks a process started by the demo as a scheduler
// instance (the worker on a schedule).
const schedulerEnv = "INVENTORY_SYNC_SCHEDULER"

// tickSchema is what the scheduled sync writes: one row per chunk a tick's
// sync committed. No unique constraint: a chunk applied twice must show.
const tickSchema = `
CREATE TABLE IF NOT EXISTS tick_chunks (
	id        bigserial   PRIMARY KEY,
	job       text        NOT NULL,
	tick      timestamptz NOT NULL,
	chunk     int         NOT NULL,
	chunks    int         NOT NULL,
	worker    text        NOT NULL,
	token     bigint      NOT NULL,
	at        timestamptz NOT NULL DEFAULT clock_timestamp()
);`

// schedConfig is one scheduler instance's.
type schedConfig struct {
	Name, Job, RedisURL, DBURL string
	Period, Offset, Lease      time.Duration
	ChunkDelay                 time.Duration
	From                       time.Time // the first tick
	Ticks, Chunks              int
	Guard                      bool
	// FreezeAt and DieAt: in the first run of a tick numbered FreezeAt
	// (DieAt) or later (from 1) that this instance starts from the tick's
	// beginning (not resuming another's), at chunk 1, it stops itself with SIGSTOP (kills
	// itself with SIGKILL), holding the job's lock mid-run. 0: never. By
	// tick, not by how many runs it started: which instance wins a tick
	// depends on the machine's load, and the fault must happen anyway.
	FreezeAt, DieAt int
}

func schedulerMain(args []string) int {
	fs := flag.NewFlagSet("inventory-sync scheduler", flag.ContinueOnError)
	var c schedConfig
	var from string
	fs.StringVar(&c.Name, "name", "S1", "instance name")
	fs.StringVar(&c.Job, "job", "stock-sync", "the job's name (its lock)")
	fs.DurationVar(&c.Period, "period", time.Second, "the schedule: a tick every period, aligned to the Unix epoch")
	fs.DurationVar(&c.Offset, "offset", 0, "this instance's clock offset (demo fault)")
	fs.DurationVar(&c.Lease, "lease", time.Second, "the job lock's lease")
	fs.DurationVar(&c.ChunkDelay, "chunk-delay", 20*time.Millisecond, "time each chunk spends in a slow query")
	fs.StringVar(&from, "from", "", "the first tick (RFC 3339)")
	fs.IntVar(&c.Ticks, "ticks", 10, "how many ticks to fire")
	fs.IntVar(&c.Chunks, "chunks", 4, "chunks per tick's sync")
	fs.BoolVar(&c.Guard, "guard", true, "run each tick through tick.Runner (off: the lock alone, as distributed lockers do)")
	fs.IntVar(&c.FreezeAt, "freeze-from-tick", 0, "SIGSTOP itself mid-run in the first tick from the n-th on that it runs (demo fault)")
	fs.IntVar(&c.DieAt, "die-from-tick", 0, "SIGKILL itself mid-run in the first tick from the n-th on that it runs (demo fault)")
	fs.StringVar(&c.RedisURL, "redis", os.Getenv("REDIS_URL"), "Redis URL (default $REDIS_URL)")
	fs.StringVar(&c.DBURL, "db", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	var err error
	if c.From, err = time.Parse(time.RFC3339Nano, from); err != nil || c.RedisURL == "" || c.DBURL == "" {
		fmt.Fprintln(os.Stderr, "inventory-sync scheduler: -from (RFC 3339), -redis and -db are required")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := newScheduler(ctx, c)
	if err != nil {
		fmt.Fprintf(os.Stderr, "inventory-sync scheduler %s: %v\n", c.Name, err)
		return exitError
	}
	defer s.close()
	s.fireAll(ctx)
	return exitOK
}

// scheduler is one instance: its clients, its job and its output.
type scheduler struct {
	c       schedConfig
	rdb     *redis.Client
	pool    *pgxpool.Pool
	locks   *fence.Client
	runner  *tick.Runner[pgfence.Run, pgx.Tx]
	mu      sync.Mutex // out and faulted
	out     *json.Encoder
	faulted bool // its fault happened (it is injected once)
}

func newScheduler(ctx context.Context, c schedConfig) (*scheduler, error) {
	ropts, err := redis.ParseURL(c.RedisURL)
	if err != nil {
		return nil, err
	}
	s := &scheduler{c: c, rdb: redis.NewClient(ropts), out: json.NewEncoder(os.Stdout)}
	if s.pool, err = pgxpool.New(ctx, c.DBURL); err != nil {
		return nil, err
	}
	if s.locks, err = fence.New(s.rdb, fence.WithLiveness(c.Lease)); err != nil {
		return nil, err
	}
	store, err := pgfence.New(s.pool)
	if err != nil {
		return nil, err
	}
	s.runner, err = tick.New(s.locks, store, tick.WithClock(s.now), tick.WithWait(10*c.Period),
		tick.WithLockOptions(fence.WithLease(c.Lease)))
	return s, err
}

func (s *scheduler) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.locks.Close(ctx)
	s.pool.Close()
	_ = s.rdb.Close()
}

// now is this instance's clock, offset from the machine's.
func (s *scheduler) now() time.Time { return time.Now().Add(s.c.Offset) }

func (s *scheduler) event(event, tickKey string, chunk int, token int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.out.Encode(workerEvent{Worker: s.c.Name, Event: event, Chunk: chunk, Token: token, Detail: tickKey})
}

// fireAll fires each tick when it falls on this instance's clock, each in
// a goroutine of its own (as gocron and robfig's cron do), and waits for
// them.
func (s *scheduler) fireAll(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	s.event("ready", "", -1, 0)
	every := tick.Every(s.c.Period)
	for i := range s.c.Ticks {
		at := s.c.From.Add(time.Duration(i) * s.c.Period)
		if err := sleepCtx(ctx, at.Sub(s.now())); err != nil {
			return
		}
		wg.Go(func() { s.fire(ctx, every, at) })
	}
}

func (s *scheduler) fire(ctx context.Context, every tick.Every, at time.Time) {
	if !s.c.Guard {
		s.lockOnly(ctx, at)
		return
	}
	out, err := s.runner.Run(ctx, s.c.Job, every, at, func(ctx context.Context, t *tick.Tick[pgfence.Run]) error {
		from := 0
		if t.Cursor != "" {
			n, err := strconv.Atoi(t.Cursor)
			if err != nil {
				return err
			}
			from = n + 1
		}
		for chunk := from; chunk < s.c.Chunks; chunk++ {
			if from == 0 {
				s.fault(t.At, chunk, t.Key, t.Lock.Token())
			}
			err := t.Run.Step(ctx, strconv.Itoa(chunk), func(ctx context.Context, tx pgx.Tx) error {
				return s.writeChunk(ctx, tx, t.At, chunk, t.Lock.Token())
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
	case errors.Is(err, guard.ErrStaleToken):
		s.event("its write refused by Postgres (stale token)", tick.Key(at), -1, 0)
	case errors.Is(err, guard.ErrLeaseLost):
		s.event("stopped: its lock was lost, its write refused", tick.Key(at), -1, 0)
	case err != nil:
		s.event("failed: "+err.Error(), tick.Key(at), -1, 0)
	case out.Resumed:
		s.event("ran (resumed at the cursor of the holder before)", tick.Key(at), -1, out.Token)
	default:
		s.event(out.Result.String(), tick.Key(at), -1, out.Token)
	}
}

// lockOnly is the tick as a distributed locker runs it (guard off): one
// attempt at the job's lock, then the whole sync in plain transactions.
func (s *scheduler) lockOnly(ctx context.Context, at time.Time) {
	lock, err := s.locks.TryAcquire(ctx, s.c.Job, fence.WithLease(s.c.Lease))
	if err != nil {
		s.event("held elsewhere", tick.Key(at), -1, 0)
		return
	}
	defer func() { _ = lock.Release(context.WithoutCancel(ctx)) }()
	for chunk := range s.c.Chunks {
		s.fault(at, chunk, tick.Key(at), lock.Token())
		if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			return s.writeChunk(ctx, tx, at, chunk, lock.Token())
		}); err != nil {
			s.event("failed", tick.Key(at), chunk, lock.Token())
			return
		}
	}
	s.event("ran", tick.Key(at), -1, lock.Token())
}

// fault stops or kills this process, once, at chunk 1 of the tick at, when
// told to from that tick's number on. Resumed runs, which start past
// chunk 0, are left alone: the instance that resumes a tick is not the
// one that interrupts the next.
func (s *scheduler) fault(at time.Time, chunk int, tickKey string, token int64) {
	if chunk != 1 {
		return
	}
	no := int(at.Sub(s.c.From)/s.c.Period) + 1
	s.mu.Lock()
	freezeNow := !s.faulted && s.c.FreezeAt > 0 && no >= s.c.FreezeAt
	dieNow := !s.faulted && s.c.DieAt > 0 && no >= s.c.DieAt
	s.faulted = s.faulted || freezeNow || dieNow
	s.mu.Unlock()
	switch {
	case freezeNow:
		s.event("frozen", tickKey, chunk, token)
		freeze()
	case dieNow:
		s.event("dying", tickKey, chunk, token)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
}

// writeChunk writes one chunk of the tick's sync (a slow query, then its row).
func (s *scheduler) writeChunk(ctx context.Context, tx pgx.Tx, at time.Time, chunk int, token int64) error {
	if _, err := tx.Exec(ctx, "SELECT pg_sleep($1)", s.c.ChunkDelay.Seconds()); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO tick_chunks (job, tick, chunk, chunks, worker, token) VALUES ($1, $2, $3, $4, $5, $6)`,
		s.c.Job, at, chunk, s.c.Chunks, s.c.Name, token)
	return err
}
