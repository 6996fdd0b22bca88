// Command inventory-sync is a stock-sync worker and the demo that
// reproduces the duplicate-rows incident and shows its prevention.
//
//	go run ./examples/inventory-sync            # the demo (make demo)
//	go run ./examples/inventory-sync -scenario pause
//	go run ./examples/inventory-sync -json      # only the JSON result
//	go run ./examples/inventory-sync worker -h  # one worker
//	go run ./examples/inventory-sync scheduler -h  # one instance of the worker on a schedule
//
// The demo starts throwaway Redis and Postgres servers (or uses REDIS_URL and
// DATABASE_URL), applies the fencelock migrations, and runs each scenario
// twice, guard off and guard on, with the workers as separate processes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
)

// workerEnv marks a process started by the demo as a worker, so that the
// demo can re-execute its own binary (or a test binary) as a worker.
const workerEnv = "INVENTORY_SYNC_WORKER"

// Exit codes of a worker.
const (
	exitOK        = 0
	exitError     = 1
	exitUsage     = 2
	exitStale     = 3 // a write was rejected by the database: stale token
	exitLockLost  = 4 // the worker stopped because its lock was lost
	exitInterrupt = 130
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if os.Getenv(schedulerEnv) == "1" || (len(args) > 0 && args[0] == "scheduler") {
		if len(args) > 0 && args[0] == "scheduler" {
			args = args[1:]
		}
		return schedulerMain(args)
	}
	if os.Getenv(workerEnv) == "1" || (len(args) > 0 && args[0] == "worker") {
		if len(args) > 0 && args[0] == "worker" {
			args = args[1:]
		}
		return workerMain(args)
	}
	if len(args) > 0 && args[0] == "demo" {
		args = args[1:]
	}
	return demoMain(args)
}

func workerMain(args []string) int {
	fs := flag.NewFlagSet("inventory-sync worker", flag.ContinueOnError)
	var cfg Config
	fs.StringVar(&cfg.Run, "run", "manual", "label of this run in sync_log")
	fs.StringVar(&cfg.Name, "name", "A", "worker name")
	fs.StringVar(&cfg.Warehouse, "warehouse", "wh-1", "warehouse; the lock is stock-sync:<warehouse>")
	fs.StringVar(&cfg.Snapshot, "snapshot", "snap-1", "source snapshot id")
	fs.DurationVar(&cfg.Lease, "lease", 30*time.Second, "lock lease")
	fs.BoolVar(&cfg.Watchdog, "watchdog", true, "renew the lease while working (false: fixed lease)")
	fs.BoolVar(&cfg.Guard, "guard", true, "write through guard (fencing tokens checked by Postgres, resumable run)")
	fs.IntVar(&cfg.ChunkSize, "chunk-size", 100, "rows per write transaction")
	fs.DurationVar(&cfg.ChunkDelay, "chunk-delay", 0, "time each chunk spends in a slow query before its write")
	fs.IntVar(&cfg.FreezeAt, "freeze-at-chunk", -1, "stop this process with SIGSTOP in the middle of writing this chunk (demo fault)")
	fs.IntVar(&cfg.FreezeBeforeCommitAt, "freeze-before-commit-chunk", -1, "stop this process with SIGSTOP just before this chunk's COMMIT goes out (demo fault)")
	fs.StringVar(&cfg.EffectsURL, "effects-url", "", "where to push each committed chunk's stock levels (guard on: through the outbox)")
	fs.StringVar(&cfg.RedisURL, "redis", os.Getenv("REDIS_URL"), "Redis URL (default $REDIS_URL)")
	fs.StringVar(&cfg.DBURL, "db", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if cfg.RedisURL == "" || cfg.DBURL == "" {
		fmt.Fprintln(os.Stderr, "inventory-sync worker: -redis and -db (or REDIS_URL and DATABASE_URL) are required")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ropts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "inventory-sync worker: -redis: %v\n", err)
		return exitUsage
	}
	rdb := redis.NewClient(ropts)
	defer rdb.Close()
	pcfg, err := pgxpool.ParseConfig(cfg.DBURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "inventory-sync worker: -db: %v\n", err)
		return exitUsage
	}
	if cfg.FreezeBeforeCommitAt >= 0 {
		pcfg.ConnConfig.DialFunc = dialFreezer(pcfg.ConnConfig.DialFunc)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "inventory-sync worker: -db: %v\n", err)
		return exitUsage
	}
	defer pool.Close()

	w, err := NewWorker(ctx, cfg, rdb, pool)
	if err != nil {
		fmt.Fprintf(os.Stderr, "inventory-sync worker: %v\n", err)
		return exitError
	}
	err = w.Run(ctx)
	closeCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = w.Close(closeCtx)
	cancel()
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, guard.ErrStaleToken):
		return exitStale
	case errors.Is(err, fence.ErrLockLost), errors.Is(err, guard.ErrLeaseLost), errors.Is(err, context.Canceled) && ctx.Err() == nil:
		return exitLockLost
	case ctx.Err() != nil:
		return exitInterrupt
	default:
		fmt.Fprintf(os.Stderr, "inventory-sync worker %s: %v\n", cfg.Name, err)
		return exitError
	}
}
