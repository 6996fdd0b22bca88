package pgfence_test

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Statements queued with pgcore.OnCommit ride in the commit's round trip:
// a guarded write with two of them takes as many round trips as without.
// A savepoint rolled back drops what was queued through it; a tx that
// guard.Exec did not open refuses them.
func TestOnCommit(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	mustExec(t, db.Pool, "CREATE TABLE queued (v text)")
	ctx := testCtx(t)
	var writes atomic.Int64
	conn := connThrough(t, db.URL, func(c net.Conn) net.Conn { return writeCounter{Conn: c, writes: &writes} })
	s := newStore(t, conn)
	l := guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}
	exec := func(queue ...string) {
		t.Helper()
		_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
			if err := insertStock("x", 1)(ctx, tx); err != nil {
				return err
			}
			for _, v := range queue {
				if err := pgcore.OnCommit(ctx, tx, "INSERT INTO queued (v) VALUES ($1)", v); err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(t, err)
	}
	exec() // warm up: the INSERT is prepared, the token stored
	before := writes.Load()
	exec()
	without := writes.Load() - before
	before = writes.Load()
	exec("one", "two")
	with := writes.Load() - before
	assert.EqualValues(t, 3, without, "BEGIN+open, INSERT, close+COMMIT")
	assert.Equal(t, without, with, "queued statements add no round trip")
	assert.EqualValues(t, 2, count(t, db.Pool, "SELECT count(*) FROM queued"))

	_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
		require.NoError(t, pgcore.OnCommit(ctx, tx, "INSERT INTO queued (v) VALUES ($1)", "kept"))
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, pgcore.OnCommit(ctx, sp, "INSERT INTO queued (v) VALUES ($1)", "dropped"))
		require.NoError(t, sp.Rollback(ctx))
		assert.ErrorIs(t, pgcore.OnCommit(ctx, sp, "INSERT INTO queued (v) VALUES ($1)", "x"), pgcore.ErrNotGuardedTx, "a rolled-back savepoint")
		sp, err = tx.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, pgcore.OnCommit(ctx, sp, "INSERT INTO queued (v) VALUES ($1)", "released"))
		return sp.Commit(ctx)
	})
	require.NoError(t, err)
	var got []string
	rows, err := db.Pool.Query(ctx, "SELECT v FROM queued WHERE v NOT IN ('one', 'two') ORDER BY v")
	require.NoError(t, err)
	got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"kept", "released"}, got)

	plain, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = plain.Rollback(ctx) }()
	err = pgcore.OnCommit(ctx, plain, "INSERT INTO queued (v) VALUES ('x')")
	assert.ErrorIs(t, err, pgcore.ErrNotGuardedTx, "a transaction of the pool's own")
	assert.ErrorIs(t, pgcore.OnCommit[pgx.Tx](ctx, nil, "SELECT 1"), pgcore.ErrNotGuardedTx)
	_, err = guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
		assert.ErrorIs(t, pgcore.OnCommit(ctx, tx, " "), guard.ErrInvalidInput, "an empty statement")
		err := pgcore.OnCommit(ctx, tx, "SELECT $1", make(chan int))
		assert.ErrorIs(t, err, guard.ErrInvalidInput, "an argument pgx cannot encode")
		return nil
	})
	require.NoError(t, err)
}

// On a direct connection a queued statement is prepared once, in the
// commit's round trip, and bound by name after: the server keeps one
// prepared statement per queued text (pg_prepared_statements), up to a
// bound per connection past which the rest go unnamed. A queued statement
// the server cannot prepare fails its transaction with its own error, and
// the next transaction prepares the good ones as usual.
func TestOnCommitPrepared(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	mustExec(t, db.Pool, "CREATE TABLE queued (v text)")
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	s := newStore(t, conn)
	l := guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}
	exec := func(queue ...string) error {
		_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx pgx.Tx) error {
			for i, q := range queue {
				if err := pgcore.OnCommit(ctx, tx, q, "v"+strconv.Itoa(i)); err != nil {
					return err
				}
			}
			return nil
		})
		return err
	}
	prepared := func() []string {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT statement FROM pg_prepared_statements WHERE name LIKE 'fencelock\_q\_%' ORDER BY statement`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	ins := "INSERT INTO queued (v) VALUES ($1)"
	require.NoError(t, exec(ins, ins))
	require.NoError(t, exec(ins))
	assert.Equal(t, []string{ins}, prepared(), "one statement prepared for three uses")
	assert.EqualValues(t, 3, count(t, db.Pool, "SELECT count(*) FROM queued"))

	err = exec(ins, "INSERT INTO queued (v) VALUES ($1) oops")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "statement 2 of 2 queued for the commit failed")
	assert.Contains(t, err.Error(), `syntax error at or near "oops"`)
	assert.EqualValues(t, 3, count(t, db.Pool, "SELECT count(*) FROM queued"), "nothing of it committed")
	require.NoError(t, exec(ins))
	assert.Equal(t, []string{ins}, prepared())

	// Many distinct texts (SQL built with literals): a bounded number is
	// prepared, every one runs.
	for i := range 60 {
		require.NoError(t, exec("INSERT INTO queued (v) SELECT $1 || '"+strconv.Itoa(i)+"'"))
	}
	n := len(prepared())
	assert.Less(t, n, 60, "prepared queued statements are bounded per connection")
	assert.Greater(t, n, 1)
	assert.EqualValues(t, 64, count(t, db.Pool, "SELECT count(*) FROM queued"))
}
