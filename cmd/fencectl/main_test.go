package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func fencectl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code = run(ctx, args, &o, &e)
	return code, o.String(), e.String()
}

func TestMigrateAndStatus(t *testing.T) {
	db := testenv.NewDB(t)
	code, out, errOut := fencectl(t, "migrate", "status", "-db", db.URL)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "pending")

	code, out, errOut = fencectl(t, "tokens", "-db", db.URL)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "fencectl migrate up", "a missing schema must say how to install it: %s", out)

	code, out, errOut = fencectl(t, "migrate", "up", "-db", db.URL)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "up to date")
	code, out, _ = fencectl(t, "migrate", "status", "-db", db.URL)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "applied")
	assert.NotContains(t, out, "pending")

	code, _, errOut = fencectl(t, "migrate", "down", "-db", db.URL)
	require.Equal(t, 0, code, errOut)
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_namespace WHERE nspname = 'fencelock'`).Scan(&n))
	assert.Zero(t, n, "migrate down must remove the schema")
}

func TestUsageErrors(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	for _, args := range [][]string{
		{},
		{"nope"},
		{"migrate"},
		{"migrate", "sideways", "-db", "postgres://postgres@127.0.0.1:1/x"},
		{"tokens"},
		{"inspect", "-redis", "redis://127.0.0.1:1"},
		{"repair", "-redis", "redis://127.0.0.1:1", "-db", "postgres://postgres@127.0.0.1:1/x"},
	} {
		code, _, errOut := fencectl(t, args...)
		assert.Equal(t, 2, code, "args %q: %s", args, errOut)
		assert.NotEmpty(t, errOut, "args %q must say what is wrong", args)
	}
}

// After Redis lost the counter and its clock is behind the database's
// token, a new holder is rejected (safe, not live); repair raises the
// counter so that the next token is accepted again.
func TestRepairAfterCounterLoss(t *testing.T) {
	ctx := context.Background()
	r := testenv.NewRedisServer(t)
	db := testenv.NewDB(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.NoError(t, sqlDB.Close())
	store, err := pgfence.New(db.Pool)
	require.NoError(t, err)

	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	locks, err := fence.New(rdb)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locks.Close(context.Background()) })

	// The database has seen a token far ahead of the Redis clock (as after
	// a counter loss plus a clock that ran backwards).
	const ahead = int64(1) << 52
	_, err = db.Pool.Exec(ctx, `INSERT INTO fencelock.fence (resource, token, holder) VALUES ('job', $1, 'old')`, ahead)
	require.NoError(t, err)

	lock, err := locks.Acquire(ctx, "job")
	require.NoError(t, err)
	err = store.Advance(ctx, lock)
	require.ErrorIs(t, err, guard.ErrStaleToken, "a token below the database's must be rejected")
	require.NoError(t, lock.Release(ctx))

	code, out, errOut := fencectl(t, "doctor", "-redis", r.URL, "-db", db.URL)
	assert.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "fencectl repair job", "doctor must point at the repair")

	code, out, errOut = fencectl(t, "repair", "-redis", r.URL, "-db", db.URL, "job")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "job: counter is")

	code, out, _ = fencectl(t, "inspect", "-redis", r.URL, "job")
	require.Equal(t, 0, code)
	assert.True(t, strings.Contains(out, "job"), out)

	lock, err = locks.Acquire(ctx, "job")
	require.NoError(t, err)
	defer lock.Release(ctx)
	assert.Greater(t, lock.Token(), ahead)
	require.NoError(t, store.Advance(ctx, lock), "after repair the new token must be accepted")

	code, out, _ = fencectl(t, "tokens", "-db", db.URL)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "job")
}
