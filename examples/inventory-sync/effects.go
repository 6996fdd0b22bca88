package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/outbox"
)

// receiver is the demo's marketplace API: it applies every push it gets,
// as such an API does, and records it in effects_received, where the demo
// counts what arrived.
type receiver struct {
	url  string
	srv  *http.Server
	done chan struct{}
}

func startReceiver(pool *pgxpool.Pool) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("inventory-sync: receiver: %w", err)
	}
	rc := &receiver{url: "http://" + ln.Addr().String() + "/stock-levels", done: make(chan struct{})}
	rc.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b effectBody
		if err := json.NewDecoder(io.LimitReader(r.Body, outbox.MaxPayload)).Decode(&b); err != nil {
			http.Error(w, "not a stock push: "+err.Error(), http.StatusBadRequest)
			return
		}
		_, err := pool.Exec(r.Context(), `INSERT INTO effects_received (run, key, worker, token, chunk, skus) VALUES ($1, $2, $3, $4, $5, $6)`,
			b.Run, r.Header.Get("Idempotency-Key"), b.Worker, b.Token, b.Chunk, len(b.Levels))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(rc.done)
		_ = rc.srv.Serve(ln)
	}()
	return rc, nil
}

func (rc *receiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = rc.srv.Shutdown(ctx)
	<-rc.done
}

// startRelay runs the demo's outbox relay until stop: it delivers what
// the guarded workers recorded. Workers are other processes, so it finds
// their effects by polling.
func startRelay(pool *pgxpool.Pool) (stop func(), err error) {
	tr := &http.Transport{}
	r, err := outbox.NewRelay(pool, &outbox.HTTPSender{Client: &http.Client{Transport: tr}},
		outbox.WithPollInterval(50*time.Millisecond), outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = r.Run(ctx)
	}()
	return func() {
		cancel()
		wg.Wait()
		tr.CloseIdleConnections()
	}, nil
}

// waitDelivered waits until the outbox is empty: every committed chunk's
// push delivered.
func waitDelivered(ctx context.Context, pool *pgxpool.Pool, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := outbox.Count(ctx, pool)
		if err != nil {
			return err
		}
		if c.Due+c.Waiting+c.Claimed+c.Dead == 0 {
			return nil
		}
		if c.Dead > 0 {
			return errors.New("inventory-sync: pushes died in the outbox: fencectl outbox list --dead shows why")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("inventory-sync: %d pushes still in the outbox after %v", c.Due+c.Waiting+c.Claimed, limit)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// countEffects counts, from effects_received and sync_log, what the
// receiver got in a run: every push, the chunks it applied more than
// once, and the pushes from a transaction that did not commit or that
// committed after a newer holder had taken the lock.
func countEffects(ctx context.Context, pool *pgxpool.Pool, runName string, r *Result) error {
	err := pool.QueryRow(ctx, `
		SELECT count(*),
		       (SELECT count(*) FROM (SELECT 1 FROM effects_received WHERE run = $1 GROUP BY key HAVING count(*) > 1) d),
		       count(*) FILTER (WHERE NOT EXISTS (
		           SELECT 1 FROM sync_log c
		            WHERE c.run = e.run AND c.event = 'committed' AND c.worker = e.worker AND c.token = e.token AND c.chunk = e.chunk
		              AND NOT EXISTS (SELECT 1 FROM sync_log a WHERE a.run = c.run AND a.event = 'acquired' AND a.token > c.token AND a.at < c.at)))
		  FROM effects_received e WHERE e.run = $1`, runName).Scan(&r.EffectsSent, &r.EffectsDuplicate, &r.EffectsStale)
	if err != nil {
		return fmt.Errorf("count effects: %w", err)
	}
	return nil
}
