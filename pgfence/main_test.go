package pgfence_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5/stdlib"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newDB returns a fresh database with the fencelock schema applied from
// the embedded migrations.
func newDB(t testing.TB) *testenv.DB {
	t.Helper()
	db := testenv.NewDB(t)
	migrate(t, db)
	return db
}

func migrate(t testing.TB, db *testenv.DB) {
	t.Helper()
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, sqlDB); err != nil {
		t.Fatalf("migrations.Up: %v", err)
	}
}

func newStore(t testing.TB, db *testenv.DB, opts ...pgfence.Option) *pgfence.Store {
	t.Helper()
	s, err := pgfence.New(db.Pool, opts...)
	if err != nil {
		t.Fatalf("pgfence.New: %v", err)
	}
	return s
}

// lease is a fixed lease for tests that do not need a lock server.
type lease struct {
	name   string
	token  int64
	holder string
	done   chan struct{}
}

func (l *lease) Name() string   { return l.name }
func (l *lease) Token() int64   { return l.token }
func (l *lease) Holder() string { return l.holder }

// doneLease is a lease with a Done channel, like *fence.Lock.
type doneLease struct {
	lease
	done chan struct{}
}

func (l *doneLease) Done() <-chan struct{} { return l.done }
