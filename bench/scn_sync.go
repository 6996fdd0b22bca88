package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// syncSchema is the stock-sync schema of examples/inventory-sync
// (schema.go), which the worker expects and the demo installs.
const syncSchema = `
CREATE TABLE source_stock (
	warehouse text NOT NULL, snapshot_id text NOT NULL, sku text NOT NULL, qty int NOT NULL,
	PRIMARY KEY (warehouse, snapshot_id, sku));
CREATE TABLE stock_records (
	id bigserial PRIMARY KEY, warehouse text NOT NULL, snapshot_id text NOT NULL, sku text NOT NULL,
	qty int NOT NULL, worker text NOT NULL, token bigint NOT NULL,
	written_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE sync_batches (
	warehouse text NOT NULL, snapshot_id text NOT NULL,
	done_at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (warehouse, snapshot_id));
CREATE TABLE sync_log (
	id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp(), run text NOT NULL,
	worker text NOT NULL, token bigint NOT NULL DEFAULT 0, event text NOT NULL,
	chunk int NOT NULL DEFAULT -1, detail text NOT NULL DEFAULT '');
`

const syncChunk = 100 // the worker's default -chunk-size

func runSync(ctx context.Context, e *env, res *results) error {
	s := res.scenario("sync")
	bin, err := buildWorker(ctx)
	if err != nil {
		// No stand-in: a copy of the worker's loop would measure something
		// else under the same name.
		return fmt.Errorf("build the inventory-sync worker: %w", err)
	}
	defer os.RemoveAll(filepath.Dir(bin))
	return runSyncWorker(ctx, e, s, bin)
}

// buildWorker builds the stock-sync worker of examples/inventory-sync, so
// that the scenario measures the real worker as the demo runs it: a
// separate process.
func buildWorker(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp("", "fencebench-worker-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "inventory-sync")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/fencelock/fencelock/examples/inventory-sync").CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("go build: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

func seedSnapshot(ctx context.Context, pool *pgxpool.Pool, snap string, n int) error {
	_, err := pool.Exec(ctx, `
		INSERT INTO source_stock (warehouse, snapshot_id, sku, qty)
		SELECT 'w1', $1, format('SKU-%s', lpad(i::text, 6, '0')), (i * 7919) % 500
		FROM generate_series(1, $2::int) AS i`, snap, n)
	return err
}

// runSyncWorker runs the worker process once per mode per repetition and
// times it from its "acquired" event to its "finished" event (process
// start and connection set-up excluded), read from its stdout as they come.
func runSyncWorker(ctx context.Context, e *env, s *scenario, bin string) error {
	db, err := e.newPGDB(ctx, false)
	if err != nil {
		return err
	}
	defer db.close(ctx, e)
	if _, err := db.direct.Exec(ctx, syncSchema); err != nil {
		return err
	}
	rates := map[string][]float64{}
	for rep := 0; rep < e.cfg.Reps; rep++ {
		modes := []bool{true, false}
		if rep%2 == 1 {
			modes = []bool{false, true}
		}
		for _, guardOn := range modes {
			snap := fmt.Sprintf("snap-%d-%v", rep, guardOn)
			if err := seedSnapshot(ctx, db.direct, snap, e.cfg.SyncRows); err != nil {
				return err
			}
			d, err := runWorkerOnce(ctx, bin, e.redis.URL, db.url, snap, guardOn)
			if err != nil {
				return fmt.Errorf("worker guard=%v: %w", guardOn, err)
			}
			var n int
			if err := db.direct.QueryRow(ctx, `SELECT count(*) FROM stock_records WHERE snapshot_id = $1`, snap).Scan(&n); err != nil {
				return err
			}
			if n != e.cfg.SyncRows {
				return fmt.Errorf("worker guard=%v wrote %d rows, want %d", guardOn, n, e.cfg.SyncRows)
			}
			name := "guard off"
			if guardOn {
				name = "guard on"
			}
			rates[name] = append(rates[name], float64(n)/d.Seconds())
		}
	}
	s.set("guard on", "rows_per_s", newFigure("rows/s", rates["guard on"], nil))
	s.set("guard off", "rows_per_s", newFigure("rows/s", rates["guard off"], nil))
	s.Ratios["on/off"] = pairedRatio(rates["guard on"], rates["guard off"])
	s.Notes = append(s.Notes, fmt.Sprintf("the inventory-sync worker (examples/inventory-sync, built once, run as `inventory-sync worker -guard=<on|off> -chunk-size %d`, a separate process on the client CPU with GOMAXPROCS=1) syncs a fresh %d-SKU snapshot, once per mode per repetition, modes alternating; rows/s from its \"acquired\" to its \"finished\" event (process start and connection set-up excluded). Every run is checked to have written exactly the snapshot's rows.", syncChunk, e.cfg.SyncRows))
	return nil
}

func runWorkerOnce(ctx context.Context, bin, redisURL, dbURL, snap string, guardOn bool) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "worker", "-run", "bench", "-name", "B", "-warehouse", "w1",
		"-snapshot", snap, "-guard="+strconv.FormatBool(guardOn), "-chunk-size", strconv.Itoa(syncChunk),
		"-redis", redisURL, "-db", dbURL)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	var acquired, finished time.Time
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		now := time.Now()
		var ev struct {
			Event string `json:"event"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		switch ev.Event {
		case "acquired":
			acquired = now
		case "finished":
			finished = now
		}
	}
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	if acquired.IsZero() || finished.IsZero() {
		return 0, fmt.Errorf("no acquired/finished events on the worker's stdout (stderr: %s)", strings.TrimSpace(stderr.String()))
	}
	return finished.Sub(acquired), nil
}
