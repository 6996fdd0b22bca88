package pgfence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// exampleStore makes a fresh database with the fencelock schema and a
// stock table, on the test binary's shared Postgres.
func exampleStore(ctx context.Context) (*pgxpool.Pool, *pgfence.Store, func()) {
	pg, err := testenv.SharedPostgres()
	must(err)
	name, url, err := pg.CreateDatabase(ctx)
	must(err)
	pool, err := pgxpool.New(ctx, url)
	must(err)
	sqlDB := stdlib.OpenDBFromPool(pool)
	must(migrations.Up(ctx, sqlDB))
	must(sqlDB.Close())
	_, err = pool.Exec(ctx, "CREATE TABLE stock (sku text, qty int)")
	must(err)
	store, err := pgfence.New(pool)
	must(err)
	return pool, store, func() {
		pool.Close()
		_ = pg.DropDatabase(context.Background(), name)
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// A long batch in fenced steps: a new holder resumes at the cursor, a
// stale holder's step is rejected, a finished run is a no-op.
func ExampleStore_Run() {
	ctx := context.Background()
	pool, store, cleanup := exampleStore(ctx)
	defer cleanup()

	pages := []string{"page-1", "page-2", "page-3"}
	syncPage := func(page string) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO stock VALUES ($1, 1)", page)
			return err
		}
	}
	// runFrom runs the remaining pages, stopping after limit steps.
	runFrom := func(run pgfence.Run, limit int) error {
		cursor, finished, err := run.Resume(ctx)
		if err != nil || finished {
			return err
		}
		start := 0
		for i, p := range pages {
			if p == cursor {
				start = i + 1
			}
		}
		for _, p := range pages[start:] {
			if limit == 0 {
				return nil
			}
			limit--
			if err := run.Step(ctx, p, syncPage(p)); err != nil {
				return err
			}
		}
		return run.Finish(ctx)
	}

	a := store.Run(guardtest.Lease{Resource: "stock-sync", Tok: 1, Who: "worker-a"}, "snapshot-42")
	must(runFrom(a, 1)) // A syncs page-1, then pauses
	b := store.Run(guardtest.Lease{Resource: "stock-sync", Tok: 2, Who: "worker-b"}, "snapshot-42")
	must(runFrom(b, -1)) // B takes over and finishes
	// A wakes up. Its step, had it not resumed first, is rejected...
	err := a.Step(ctx, "page-2", syncPage("page-2"))
	fmt.Println("A's late step is stale:", errors.Is(err, guard.ErrStaleToken))
	// ...and resuming finds the run finished: nothing to do.
	must(runFrom(a, -1))

	cursor, finished, err := store.Run(guardtest.Lease{Resource: "stock-sync", Tok: 3, Who: "worker-c"}, "snapshot-42").Resume(ctx)
	must(err)
	fmt.Println("cursor:", cursor, "finished:", finished)
	var n int
	must(pool.QueryRow(ctx, "SELECT count(*) FROM stock").Scan(&n))
	fmt.Println("rows:", n)
	// Output:
	// A's late step is stale: true
	// cursor: page-3 finished: true
	// rows: 3
}

// Writers that do not use guard (raw SQL, other languages) are fenced by a
// protected table: they claim first, in the same transaction.
func ExampleStore_Protect() {
	ctx := context.Background()
	pool, store, cleanup := exampleStore(ctx)
	defer cleanup()
	must(store.Protect(ctx, "stock", pgfence.ForResource("stock-sync")))

	write := func(claim string) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if claim != "" {
			if _, err := tx.Exec(ctx, claim); err != nil {
				return pgfence.MapError(err)
			}
		}
		if _, err := tx.Exec(ctx, "INSERT INTO stock VALUES ('sku-1', 5)"); err != nil {
			return pgfence.MapError(err)
		}
		return tx.Commit(ctx)
	}
	fmt.Println(errors.Is(write(""), guard.ErrNotClaimed))
	fmt.Println(write("SELECT fencelock.claim('stock-sync', 7, 'worker-b')"))
	fmt.Println(errors.Is(write("SELECT fencelock.claim('stock-sync', 6, 'worker-a')"), guard.ErrStaleToken))
	// Output:
	// true
	// <nil>
	// true
}

// Advance records a new holder's token at once: from then on the database
// refuses the previous holder's writes, even one that began before, and
// says by how much it was overtaken.
func ExampleStore_Advance() {
	ctx := context.Background()
	_, store, cleanup := exampleStore(ctx)
	defer cleanup()
	old := guardtest.Lease{Resource: "stock-sync:eu", Tok: 41, Who: "worker-1"}
	newer := guardtest.Lease{Resource: "stock-sync:eu", Tok: 42, Who: "worker-2"}

	must(store.Advance(ctx, newer))
	_, err := guard.Exec(ctx, store, old, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO stock VALUES ('sku-1', 5)")
		return err
	})
	var stale *guard.StaleTokenError
	fmt.Println("old holder refused:", errors.As(err, &stale), "token", stale.Token, "current", stale.Current)
	// Output:
	// old holder refused: true token 41 current 42
}
