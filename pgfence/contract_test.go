package pgfence_test

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestContract runs guard's store contract (package guardtest) on pgfence
// over a pool.
func TestContract(t *testing.T) {
	guardtest.Run(t, msgtest.Harness(func(t testing.TB) guardtest.Database[pgx.Tx] {
		db := newDB(t)
		return pgxDatabase{url: db.URL, pool: db.Pool}
	}))
}

// pgxDatabase is guardtest's view of a test database through pgx.
type pgxDatabase struct {
	url  string
	pool *pgxpool.Pool
}

func (d pgxDatabase) NewStore(t testing.TB) guard.Store[pgx.Tx] {
	t.Helper()
	p, err := pgxpool.New(context.Background(), d.url)
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(p.Close)
	return newStore(t, p)
}

func (d pgxDatabase) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := d.pool.Exec(ctx, sql, args...)
	return err
}

func (d pgxDatabase) QueryInt(ctx context.Context, sql string, args ...any) (n int64, err error) {
	err = d.pool.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

func (pgxDatabase) TxExec(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
	_, err := tx.Exec(ctx, sql, args...)
	return err
}

func (pgxDatabase) TxQueryInt(ctx context.Context, tx pgx.Tx, sql string, args ...any) (n int64, err error) {
	err = tx.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

func (pgxDatabase) TxCommit(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }

// TestContractPgBouncer runs the same contract with every store behind
// PgBouncer in transaction pooling mode, on a pool that keeps pgx's default
// exec mode (cache_statement): pgfence's own statements must work there
// whatever the user's pool does. Each store gets a PgBouncer of its own, as
// another process would, so that one opened after the database was made
// read-only gets server connections that see it so.
func TestContractPgBouncer(t *testing.T) {
	guardtest.Run(t, msgtest.Harness(func(t testing.TB) guardtest.Database[pgx.Tx] {
		db := newDB(t)
		return bouncedDatabase{pgxDatabase: pgxDatabase{url: db.URL, pool: db.Pool}, tdb: db}
	}))
}

type bouncedDatabase struct {
	pgxDatabase
	tdb *testenv.DB
}

func (d bouncedDatabase) NewStore(t testing.TB) guard.Store[pgx.Tx] {
	t.Helper()
	b, err := testenv.StartPgBouncer(d.tdb.Server, 4)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	p, err := pgxpool.New(context.Background(), b.URL(d.tdb.Name))
	if err != nil {
		t.Fatalf("pgxpool.New through PgBouncer: %v", err)
	}
	t.Cleanup(p.Close)
	if mode := p.Config().ConnConfig.DefaultQueryExecMode; mode != pgx.QueryExecModeCacheStatement {
		t.Fatalf("pool exec mode %v, want pgx's default (cache_statement)", mode)
	}
	return newStore(t, p)
}

// The contract's own statements (the user's, in fn and around it) name the
// exec mode a transaction pooler needs, as docs/operations.md tells users to; the
// pool's default stays pgx's, which only pgfence's statements meet.

func (bouncedDatabase) TxExec(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
	_, err := tx.Exec(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
	return err
}

func (bouncedDatabase) TxQueryInt(ctx context.Context, tx pgx.Tx, sql string, args ...any) (n int64, err error) {
	err = tx.QueryRow(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...).Scan(&n)
	return n, err
}
