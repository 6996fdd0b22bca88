package ticktest

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/fencelock/fencelock/tick"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// Env is a test's servers: a Redis and a fresh database with the fencelock
// schema and the effects table (Schema).
type Env struct {
	Redis *testenv.Redis
	DB    *testenv.DB
}

// NewEnv starts the test's servers (testenv.NewRedis, testenv.NewDB) and
// migrates the database; it fails the test when one cannot be had.
func NewEnv(t testing.TB) *Env {
	t.Helper()
	e := &Env{Redis: testenv.NewRedis(t), DB: testenv.NewDB(t)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sqlDB := stdlib.OpenDBFromPool(e.DB.Pool)
	defer sqlDB.Close()
	if err := migrations.Up(ctx, sqlDB); err != nil {
		t.Fatalf("migrations.Up: %v", err)
	}
	if _, err := e.DB.Pool.Exec(ctx, Schema); err != nil {
		t.Fatalf("ticktest schema: %v", err)
	}
	return e
}

// Instance is one scheduler instance of a test: its own fence client (on
// the test's key prefix), store and Runner, closed at the end of the test.
type Instance struct {
	Locks  *fence.Client
	Store  *pgfence.Store
	Runner *tick.Runner[pgfence.Run, pgx.Tx]
}

// NewInstance makes an instance on e.
func (e *Env) NewInstance(t testing.TB, opts ...tick.Option) *Instance {
	t.Helper()
	locks, err := fence.New(e.Redis.Client(), fence.WithPrefix(e.Redis.Prefix+"fence:"))
	if err != nil {
		t.Fatalf("fence.New: %v", err)
	}
	t.Cleanup(func() { _ = locks.Close(context.Background()) })
	store, err := pgfence.New(e.DB.Pool)
	if err != nil {
		t.Fatalf("pgfence.New: %v", err)
	}
	r, err := tick.New(locks, store, opts...)
	if err != nil {
		t.Fatalf("tick.New: %v", err)
	}
	return &Instance{Locks: locks, Store: store, Runner: r}
}
