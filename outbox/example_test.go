package outbox_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// exampleDB creates a throwaway database with the fencelock schema and a
// stock table; in a real program it is yours, migrated at start-up.
func exampleDB() (*pgxpool.Pool, func()) {
	ctx := context.Background()
	pg, err := testenv.SharedPostgres() // stopped by testenv.Main
	must(err)
	name, url, err := pg.CreateDatabase(ctx)
	must(err)
	pool, err := pgxpool.New(ctx, url)
	must(err)
	sqlDB := stdlib.OpenDBFromPool(pool)
	must(migrations.Up(ctx, sqlDB))
	must(sqlDB.Close())
	_, err = pool.Exec(ctx, "CREATE TABLE stock (sku text PRIMARY KEY, qty int)")
	must(err)
	return pool, func() {
		pool.Close()
		_ = pg.DropDatabase(ctx, name)
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// lease stands for a *fence.Lock held by the worker (see package fence).
var lease = guardtest.Lease{Resource: "stock-sync:eu", Tok: 42, Who: "worker-1"}

// Add records an effect in the guarded transaction that makes the change:
// it is sent only if that transaction commits, and never by a stale holder.
func ExampleAdd() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	store, err := pgfence.New(pool)
	must(err)

	_, err = guard.Exec(ctx, store, lease, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO stock VALUES ('sku-1', 5)"); err != nil {
			return err
		}
		return outbox.Add(ctx, tx, outbox.Effect{
			Destination: "https://shop.example/stock",
			Key:         "stock-sync:eu:batch-7",
			Payload:     []byte(`{"sku":"sku-1","qty":5}`),
		})
	})
	fmt.Println("committed:", err)

	// A transaction that rolls back records nothing.
	_, err = guard.Exec(ctx, store, lease, func(ctx context.Context, tx pgx.Tx) error {
		if err := outbox.Add(ctx, tx, outbox.Effect{Destination: "https://shop.example/stock", Key: "batch-8"}); err != nil {
			return err
		}
		return fmt.Errorf("the batch failed")
	})
	fmt.Println("rolled back:", err)

	c, err := outbox.Count(ctx, pool)
	must(err)
	fmt.Println("effects due:", c.Due)
	// Output:
	// committed: <nil>
	// rolled back: the batch failed
	// effects due: 1
}

// A relay sends the committed effects: here to a Sender of its own; an
// HTTPSender posts them with the idempotency key and the fencing headers.
func ExampleRelay() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	store, err := pgfence.New(pool)
	must(err)
	_, err = guard.Exec(ctx, store, lease, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.Add(ctx, tx, outbox.Effect{Destination: "stock-feed", Key: "batch-7", Payload: []byte("sku-1=5")})
	})
	must(err)

	sent := make(chan outbox.Delivery, 1)
	relay, err := outbox.NewRelay(pool, outbox.SenderFunc(func(ctx context.Context, d outbox.Delivery) error {
		sent <- d
		return nil
	}), outbox.WithPollInterval(100*time.Millisecond))
	must(err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()

	d := <-sent
	fmt.Printf("sent %s to %s: %s (resource %s, token %d)\n", d.Key, d.Destination, d.Payload, d.Resource, d.Token)
	stop()
	must(<-done)
	// Output:
	// sent batch-7 to stock-feed: sku-1=5 (resource stock-sync:eu, token 42)
}

// Receive applies each delivery once, in a guarded transaction of the
// receiving service: a redelivery is answered 200 without applying it
// again, and a delivery from an older holder than one already applied is
// refused (409).
func ExampleReceive() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	store, err := pgfence.New(pool)
	must(err)

	srv := httptest.NewServer(outbox.Receive(store, func(ctx context.Context, tx pgx.Tx, d outbox.Delivery) error {
		_, err := tx.Exec(ctx, "INSERT INTO stock VALUES ('sku-1', 5) ON CONFLICT (sku) DO UPDATE SET qty = stock.qty + 5")
		return err
	}))
	defer srv.Close()

	post := func(token int64, key string) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		must(err)
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Fencing-Resource", "stock-sync:eu")
		req.Header.Set("Fencing-Token", fmt.Sprint(token))
		req.Header.Set("Fencing-Holder", "worker-1")
		resp, err := http.DefaultClient.Do(req)
		must(err)
		resp.Body.Close()
		return resp.StatusCode
	}
	fmt.Println("first delivery:", post(42, "batch-7"))
	fmt.Println("redelivered:", post(42, "batch-7"))
	fmt.Println("older holder:", post(41, "batch-6"))

	var qty int
	must(pool.QueryRow(ctx, "SELECT qty FROM stock").Scan(&qty))
	fmt.Println("qty:", qty)
	// Output:
	// first delivery: 200
	// redelivered: 200
	// older holder: 409
	// qty: 5
}
