package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
)

func newLocks(t *testing.T, r *testenv.Redis, opts ...fence.ClientOption) *fence.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	locks, err := fence.New(rdb, append([]fence.ClientOption{fence.WithPrefix(r.Prefix)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locks.Close(context.Background()) })
	return locks
}

// migrationFiles are the names of the embedded migrations, in order.
func migrationFiles(t *testing.T) []string {
	t.Helper()
	names, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, names)
	return names
}

// up says which migrations it applied, then that none was pending; status
// lists them; down says what it drops and drops it only with --force and a
// yes.
func TestMigrateUpDownStatus(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := testenv.NewDB(t)
	files := migrationFiles(t)
	code, out, errOut := fencectl(t, "migrate", "status", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "pending")

	code, _, errOut = fencectl(t, "tokens", "show", "--db", db.URL)
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errOut, "fencectl migrate up --db "+shellQuote(db.URL), "a missing schema says how to install it")
	assert.NotContains(t, errOut, "goose -dir migrations", "the goose CLI's -dir works only in a checkout")

	code, out, errOut = fencectl(t, "migrate", "up", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	where := `database "` + db.Name + `" at ` + db.URL
	assert.Equal(t, "applied "+strings.Join(files, ", ")+" to "+where+": the fencelock schema is at "+files[len(files)-1]+"\n", out)
	code, out, errOut = fencectl(t, "migrate", "up", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Equal(t, fmt.Sprintf("nothing to apply: the fencelock schema in %s is at %s (all %d migrations applied)\n", where, files[len(files)-1], len(files)), out)

	code, out, _ = fencectl(t, "migrate", "status", "--db", db.URL, "-o", "json")
	require.Equal(t, exitOK, code)
	var st []migrationJSON
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Len(t, st, len(files))
	for _, s := range st {
		assert.Equal(t, "applied", s.State, s.File)
		assert.NotEmpty(t, s.AppliedAt)
	}

	_, err := db.Pool.Exec(ctx, `
INSERT INTO fencelock.fence (resource, token, holder) VALUES ('a', 5, 'h'), ('b', 7, 'h');
INSERT INTO fencelock.applied (resource, key, token) VALUES ('a', 'k1', 5);
INSERT INTO fencelock.runs (resource, run_key, token, cursor, finished, finished_at) VALUES ('a', 'r1', 5, 'c', false, NULL), ('b', 'r2', 7, 'c', true, now())`)
	require.NoError(t, err)
	schemaExists := func() bool {
		var ok bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'fencelock')`).Scan(&ok))
		return ok
	}

	code, _, errOut = fencectl(t, "migrate", "down", "--db", db.URL)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "add --force")
	require.True(t, schemaExists())

	code, out, errOut = fencectlIn(t, "n\n", "migrate", "down", "--force", "--db", db.URL)
	assert.Equal(t, exitAborted, code, out+errOut)
	assert.Contains(t, out, "This drops schema fencelock from "+where+": ")
	assert.Contains(t, out, "the tokens of 2 fenced resources (fencelock.fence)")
	assert.Contains(t, out, "1 applied idempotency keys (fencelock.applied)")
	assert.Contains(t, out, "2 runs, 1 of them open (fencelock.runs)")
	assert.Contains(t, out, "Drop it? [y/N]")
	assert.Equal(t, "fencectl: aborted: nothing was changed\n", errOut)
	require.True(t, schemaExists(), "no: nothing is dropped")
	code, out, errOut = fencectlIn(t, "", "migrate", "down", "--force", "--db", db.URL)
	assert.Equal(t, exitAborted, code, out+errOut)
	assert.Equal(t, "fencectl: aborted: nothing was changed: stdin ended without an answer; to go ahead without asking, add --yes\n", errOut,
		"no terminal: the error says how to answer without one")
	require.True(t, schemaExists(), "no answer: nothing is dropped")

	code, out, errOut = fencectlIn(t, "y\n", "migrate", "down", "--force", "--db", db.URL)
	require.Equal(t, exitOK, code, out+errOut)
	assert.Contains(t, out, "dropped schema fencelock from "+where)
	assert.False(t, schemaExists(), "migrate down removes the schema")

	code, out, errOut = fencectl(t, "migrate", "down", "--force", "--yes", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Equal(t, "nothing to drop: "+where+" has no fencelock schema\n", out)
}

// locks inspect shows the holder; release --force shows it, asks, and
// releases only on yes; the holder's lock is then lost and a waiter gets it.
func TestLocksInspectAndRelease(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedis(t)
	holder := newLocks(t, r, fence.WithLease(600*time.Millisecond))
	lock, err := holder.Acquire(ctx, "job")
	require.NoError(t, err)

	code, out, errOut := fencectl(t, "locks", "inspect", "job", "idle", "--redis", r.Addr, "--prefix", r.Prefix, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var infos []lockJSON
	require.NoError(t, json.Unmarshal([]byte(out), &infos), out)
	require.Len(t, infos, 2)
	assert.True(t, infos[0].Held)
	assert.Equal(t, lock.Holder(), infos[0].Holder)
	assert.Equal(t, lock.Token(), infos[0].Token)
	assert.Positive(t, infos[0].TTLMs)
	assert.Equal(t, lock.Token(), infos[0].Counter)
	assert.False(t, infos[1].Held)

	code, out, _ = fencectl(t, "locks", "inspect", "job", "--redis", r.Addr, "--prefix", r.Prefix)
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `NAME\s+HELD\s+HOLDER\s+TOKEN\s+TTL\s+COUNTER`, out)
	assert.Contains(t, out, lock.Holder())

	// No: nothing changes.
	code, out, errOut = fencectlIn(t, "n\n", "locks", "release", "job", "--force", "--redis", r.Addr, "--prefix", r.Prefix)
	assert.Equal(t, exitAborted, code)
	assert.Contains(t, out, "job is held by "+lock.Holder())
	assert.Contains(t, errOut, "nothing was changed")
	require.NoError(t, lock.Err())

	// A waiter is woken by the release's message, not by the lease.
	waiter := newLocks(t, r)
	got := make(chan *fence.Lock, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "job")
		assert.NoError(t, err)
		got <- l
	}()
	code, out, errOut = fencectlIn(t, "y\n", "locks", "release", "job", "--force", "--redis", r.Addr, "--prefix", r.Prefix)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "released job (was held by "+lock.Holder())
	select {
	case <-lock.Done():
		assert.ErrorIs(t, lock.Err(), fence.ErrLockLost, "the holder learns at its next renewal")
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not notice the forced release")
	}
	l2 := <-got
	require.NotNil(t, l2)
	assert.Greater(t, l2.Token(), lock.Token())

	code, out, _ = fencectl(t, "locks", "release", "idle", "--force", "--yes", "--redis", r.Addr, "--prefix", r.Prefix)
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "idle is not held")
	require.NoError(t, l2.Release(ctx))
}

// After Redis lost the counter and its clock is behind the database's
// token, new holders are rejected; tokens show says "behind", doctor fails
// naming the repair, tokens repair fixes it.
func TestTokensShowAndRepair(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedis(t)
	db := migratedDB(t)
	store, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	locks := newLocks(t, r)

	const ahead = int64(1) << 52
	_, err = db.Pool.Exec(ctx, `INSERT INTO fencelock.fence (resource, token, holder) VALUES ('job', $1, 'old'), ('fine', 1, 'old')`, ahead)
	require.NoError(t, err)
	lock, err := locks.Acquire(ctx, "job")
	require.NoError(t, err)
	require.ErrorIs(t, store.Advance(ctx, lock), guard.ErrStaleToken, "a token below the database's is rejected")
	require.NoError(t, lock.Release(ctx))

	code, out, errOut := fencectl(t, "tokens", "show", "--db", db.URL, "--redis", r.Addr, "--prefix", r.Prefix, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var states []tokenState
	require.NoError(t, json.Unmarshal([]byte(out), &states), out)
	require.Len(t, states, 2)
	assert.Equal(t, "fine", states[0].Resource)
	assert.Equal(t, "ok", states[0].Status)
	assert.Equal(t, "job", states[1].Resource)
	assert.Equal(t, ahead, states[1].Mark)
	assert.Equal(t, "behind", states[1].Status)

	code, out, _ = fencectl(t, "tokens", "show", "--db", db.URL)
	require.Equal(t, exitOK, code)
	assert.NotContains(t, out, "STATUS", "without Redis, only the database's side")
	assert.Contains(t, out, "job")

	code, out, errOut = fencectl(t, "tokens", "repair", "--all", "--redis", r.Addr, "--prefix", r.Prefix, "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "job: counter is")
	assert.NotContains(t, out, "fine:", "--all repairs only what is behind")

	lock, err = locks.Acquire(ctx, "job")
	require.NoError(t, err)
	defer lock.Release(ctx)
	assert.Greater(t, lock.Token(), ahead)
	require.NoError(t, store.Advance(ctx, lock), "after repair the new token is accepted")

	code, out, _ = fencectl(t, "tokens", "repair", "--all", "--redis", r.Addr, "--prefix", r.Prefix, "--db", db.URL)
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "nothing to repair")
}

func TestRunsAndKeys(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := migratedDB(t)
	_, err := db.Pool.Exec(ctx, `
INSERT INTO fencelock.runs (resource, run_key, token, cursor, finished, finished_at, updated_at) VALUES
  ('sync', 'old-done', 5, 'c9', true,  now() - interval '40 days', now() - interval '40 days'),
  ('sync', 'new-done', 6, 'c9', true,  now() - interval '1 hour',  now() - interval '1 hour'),
  ('sync', 'open',     7, 'c3', false, NULL,                       now() - interval '50 days'),
  ('other', 'done',    8, '',   true,  now() - interval '40 days', now() - interval '40 days');
INSERT INTO fencelock.applied (resource, key, token, applied_at) VALUES
  ('sync', 'batch-1', 5, now() - interval '40 days'),
  ('sync', 'batch-2', 6, now() - interval '1 hour'),
  ('other', 'batch-1', 8, now() - interval '40 days')`)
	require.NoError(t, err)

	code, out, errOut := fencectl(t, "runs", "list", "--db", db.URL, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var runs []runJSON
	require.NoError(t, json.Unmarshal([]byte(out), &runs), out)
	require.Len(t, runs, 4)
	assert.Equal(t, "new-done", runs[0].RunKey, "newest first")

	code, out, _ = fencectl(t, "runs", "list", "--db", db.URL, "--state", "open")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "c3")
	assert.NotContains(t, out, "new-done")

	code, out, _ = fencectl(t, "runs", "prune", "--db", db.URL, "--older-than", "30d", "--dry-run")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "would delete 2 finished runs")
	code, out, _ = fencectl(t, "runs", "prune", "--db", db.URL, "--older-than", "720h", "--resource", "sync")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "deleted 1 finished runs")
	var left []string
	rows, err := db.Pool.Query(ctx, `SELECT run_key FROM fencelock.runs ORDER BY run_key`)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		left = append(left, k)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{"done", "new-done", "open"}, left, "open runs are never pruned, nor young ones, nor other resources'")

	code, out, _ = fencectl(t, "keys", "prune", "--db", db.URL, "--older-than", "30d")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "deleted 2 applied idempotency keys")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.applied`).Scan(&n))
	assert.Equal(t, 1, n)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.fence`).Scan(&n))
	assert.Zero(t, n, "tokens are never pruned")
}

// A role that cannot read the tables (the migrations grant SELECT on them
// to PUBLIC; an operator may revoke it): fencectl says which grant is
// missing.
func TestTablesNeedGrant(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := migratedDB(t)
	role := "app_" + strings.ReplaceAll(db.Name, "-", "_")
	for _, q := range []string{
		`REVOKE SELECT ON ALL TABLES IN SCHEMA fencelock FROM PUBLIC`,
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA fencelock TO ` + role,
		`GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO ` + role,
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	u := strings.Replace(db.URL, "postgres://postgres@", "postgres://"+role+"@", 1)
	code, _, errOut := fencectl(t, "tokens", "show", "--db", u)
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errOut, "permission denied")
	assert.Contains(t, errOut, "GRANT SELECT")
	first, stmts, _ := strings.Cut(errOut, "\n")
	assert.Contains(t, first, "run:", "one line up to the fix's SQL")
	assert.Regexp(t, `^(  [^\n]+;\n)+$`, stmts, "then one statement a line")
}

// migrate down refuses while a table is protected, naming it; --unprotect
// drops the trigger too.
func TestMigrateDownProtected(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := migratedDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, qty int)`)
	require.NoError(t, err)
	store, err := pgfence.New(db.Pool)
	require.NoError(t, err)
	require.NoError(t, store.Protect(ctx, "stock", pgfence.ForResource("stock-sync:eu")))

	code, out, errOut := fencectl(t, "migrate", "down", "--force", "--yes", "--db", db.URL)
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errOut, "tables public.stock are protected by pgfence's Protect")
	assert.Contains(t, errOut, "add --unprotect")
	assert.NotContains(t, out, "dropped")
	code, out, errOut = fencectl(t, "migrate", "down", "--force", "--yes", "--unprotect", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "the protect triggers on public.stock")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'stock'::regclass AND NOT tgisinternal`).Scan(&n))
	assert.Zero(t, n, "the protect trigger is gone")
}
