package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
)

// exampleDB makes a fresh database with the fencelock schema and a stock
// table, on the test binary's shared Postgres, and opens it with pgx's
// database/sql driver ("pgx").
func exampleDB(ctx context.Context) (*sql.DB, func()) {
	pg, err := testenv.SharedPostgres()
	must(err)
	name, url, err := pg.CreateDatabase(ctx)
	must(err)
	db, err := sql.Open("pgx", url) // or lib/pq: sql.Open("postgres", url)
	must(err)
	must(migrations.Up(ctx, db))
	_, err = db.ExecContext(ctx, "CREATE TABLE stock (sku text, qty int)")
	must(err)
	return db, func() {
		_ = db.Close()
		_ = pg.DropDatabase(context.Background(), name)
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// fixed is a lease as a paused holder sees its lock: in real code, the
// *fence.Lock from Acquire.
type fixed struct {
	name   string
	token  int64
	holder string
}

func (l fixed) Name() string   { return l.name }
func (l fixed) Token() int64   { return l.token }
func (l fixed) Holder() string { return l.holder }

// A guarded write through database/sql: fn gets the *sql.Tx that sqlx,
// GORM or sqlc's generated code can write through; the database refuses a
// holder that was overtaken, and a batch applied before.
func Example() {
	ctx := context.Background()
	db, cleanup := exampleDB(ctx)
	defer cleanup()
	store, err := sqlfence.New(db)
	must(err)

	write := func(sku string) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO stock VALUES ($1, 1)", sku)
			return err
		}
	}
	late := fixed{"stock:eu", 41, "worker-a"} // paused past its lease
	next := fixed{"stock:eu", 42, "worker-b"} // took the lock meanwhile

	_, err = guard.Exec(ctx, store, next, write("A-1"), guard.WithKey("batch-7"))
	fmt.Println("worker-b:", err)

	_, err = guard.Exec(ctx, store, late, write("A-1"), guard.WithKey("batch-7"))
	var stale *guard.StaleTokenError
	fmt.Println("worker-a stale:", errors.As(err, &stale), stale.Current)

	_, err = guard.Exec(ctx, store, next, write("A-1"), guard.WithKey("batch-7"))
	fmt.Println("batch-7 again:", errors.Is(err, guard.ErrAlreadyApplied))

	// Raw SQL, any driver: MapError gives the same errors.
	_, err = db.ExecContext(ctx, "SELECT fencelock.claim($1, $2, $3)", "stock:eu", 41, "worker-a")
	fmt.Println("raw claim stale:", errors.Is(sqlfence.MapError(err), guard.ErrStaleToken))

	var n int
	must(db.QueryRowContext(ctx, "SELECT count(*) FROM stock").Scan(&n))
	fmt.Println("rows:", n)
	// Output:
	// worker-b: <nil>
	// worker-a stale: true 42
	// batch-7 again: true
	// raw claim stale: true
	// rows: 1
}

// A resumable run over database/sql: each step commits its writes and the
// cursor together, so a holder that takes over resumes where the last
// step committed.
func ExampleStore_Run() {
	ctx := context.Background()
	db, cleanup := exampleDB(ctx)
	defer cleanup()
	store, err := sqlfence.New(db)
	must(err)
	first := fixed{"stock-sync:eu", 41, "worker-1"}
	page := func(sku string) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO stock VALUES ($1, 1)", sku)
			return err
		}
	}
	run := store.Run(first, "nightly-2026-12-06")
	must(run.Step(ctx, "page-1", page("sku-1")))

	// worker-1 crashes; worker-2 takes over with a newer token.
	run = store.Run(fixed{"stock-sync:eu", 42, "worker-2"}, "nightly-2026-12-06")
	cursor, finished, err := run.Resume(ctx)
	must(err)
	fmt.Println("resume at:", cursor, "finished:", finished)
	must(run.Step(ctx, "page-2", page("sku-2")))
	must(run.Finish(ctx))

	err = store.Run(first, "nightly-2026-12-06").Step(ctx, "page-2", page("sku-2"))
	fmt.Println("old holder's step refused:", errors.Is(err, guard.ErrStaleToken))
	var rows int
	must(db.QueryRowContext(ctx, "SELECT count(*) FROM stock").Scan(&rows))
	fmt.Println("rows:", rows)
	// Output:
	// resume at: page-1 finished: false
	// old holder's step refused: true
	// rows: 2
}
