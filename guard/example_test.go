package guard_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
)

// A stock-sync worker: take the lock, claim its token in Postgres right
// away, then write the batch in one fenced, idempotent transaction.
func ExampleExec() {
	ctx := context.Background()
	redisURL, databaseURL, cleanup := exampleServers()
	defer cleanup()

	// Once per database: install the fencelock schema.
	pool, err := pgxpool.New(ctx, databaseURL)
	must(err)
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	must(migrations.Up(ctx, sqlDB))
	must(sqlDB.Close())
	_, err = pool.Exec(ctx, "CREATE TABLE stock (sku text, qty int)")
	must(err)

	// Per worker: a lock client and a store.
	redisOpts, err := redis.ParseURL(redisURL)
	must(err)
	rdb := redis.NewClient(redisOpts)
	defer rdb.Close()
	locks, err := fence.New(rdb)
	must(err)
	defer locks.Close(ctx)
	store, err := pgfence.New(pool)
	must(err)

	lock, err := locks.Acquire(ctx, "stock-sync:eu")
	must(err)
	defer lock.Release(ctx)
	// From now on a previous holder that wakes up is rejected.
	must(store.Advance(ctx, lock))

	syncBatch := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO stock (sku, qty) VALUES ('sku-1', 5), ('sku-2', 3)")
		return err
	}
	_, err = guard.Exec(ctx, store, lock, syncBatch, guard.WithKey("batch-7"))
	fmt.Println("first run:", err)

	// The same batch again (a retry, or another worker later): no copy.
	_, err = guard.Exec(ctx, store, lock, syncBatch, guard.WithKey("batch-7"))
	fmt.Println("retry already applied:", errors.Is(err, guard.ErrAlreadyApplied))

	var rows int
	must(pool.QueryRow(ctx, "SELECT count(*) FROM stock").Scan(&rows))
	fmt.Println("rows:", rows)
	// Output:
	// first run: <nil>
	// retry already applied: true
	// rows: 2
}

// exampleServers starts throwaway Redis and Postgres for the example; in a
// real program these are your servers.
func exampleServers() (redisURL, databaseURL string, cleanup func()) {
	rds, err := testenv.StartRedis()
	must(err)
	pg, err := testenv.SharedPostgres() // stopped by testenv.Main
	must(err)
	name, databaseURL, err := pg.CreateDatabase(context.Background())
	must(err)
	return rds.URL, databaseURL, func() {
		_ = rds.Stop()
		_ = pg.DropDatabase(context.Background(), name)
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// A holder that was overtaken while paused writes nothing: Exec's error
// says so (a *StaleTokenError), whatever the store.
func ExampleStaleTokenError() {
	ctx := context.Background()
	_, databaseURL, cleanup := exampleServers()
	defer cleanup()
	pool, err := pgxpool.New(ctx, databaseURL)
	must(err)
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	must(migrations.Up(ctx, sqlDB))
	must(sqlDB.Close())
	store, err := pgfence.New(pool)
	must(err)

	paused := guardtest.Lease{Resource: "stock-sync:eu", Tok: 7, Who: "worker-1"}
	successor := guardtest.Lease{Resource: "stock-sync:eu", Tok: 8, Who: "worker-2"}
	must(store.Advance(ctx, successor))

	_, err = guard.Exec(ctx, store, paused, func(ctx context.Context, tx pgx.Tx) error { return nil })
	var stale *guard.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Printf("refused: token %d of %q, the database has %d\n", stale.Token, stale.Resource, stale.Current)
	}
	fmt.Println("is ErrStaleToken:", errors.Is(err, guard.ErrStaleToken))
	// Output:
	// refused: token 7 of "stock-sync:eu", the database has 8
	// is ErrStaleToken: true
}
