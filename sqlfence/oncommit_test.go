package sqlfence_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Statements queued with pgcore.OnCommit go out between the claim and
// COMMIT, one round trip each (database/sql sends one statement at a
// time); a *sql.Tx that guard.Exec did not open refuses them, and so does
// fn's tx after a raw COMMIT sent through it, which also sends none.
func TestOnCommit(t *testing.T) {
	tdb, other := newDB(t)
	ctx := testCtx(t)
	var w wire
	db := wiredDB(t, tdb.URL, &w)
	mustExec(t, db, "CREATE TABLE stock (sku text, writer text)")
	mustExec(t, db, "CREATE TABLE queued (v text)")
	s := newStore(t, db)
	l := guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}
	exec := func(queue ...string) error {
		_, err := guard.Exec(ctx, s, l, func(ctx context.Context, tx *sql.Tx) error {
			if err := insert("g")(ctx, tx); err != nil {
				return err
			}
			for _, v := range queue {
				if err := pgcore.OnCommit(ctx, tx, "INSERT INTO queued (v) VALUES ($1)", v); err != nil {
					return err
				}
			}
			return nil
		})
		return err
	}
	require.NoError(t, exec("warm")) // warm up: the driver prepares each statement on first use
	before := w.writes.Load()
	require.NoError(t, exec())
	without := w.writes.Load() - before
	before = w.writes.Load()
	require.NoError(t, exec("one", "two"))
	assert.Equal(t, without+2, w.writes.Load()-before, "one round trip per queued statement")
	assert.EqualValues(t, 3, count(t, db, "SELECT count(*) FROM queued"))

	// plain comes from another pool: the wired one has one connection.
	plain, err := other.BeginTx(ctx, nil)
	require.NoError(t, err)
	assert.ErrorIs(t, pgcore.OnCommit(ctx, plain, "INSERT INTO queued (v) VALUES ('x')"), pgcore.ErrNotGuardedTx)
	_, err = guard.Exec(ctx, s, l, func(fnCtx context.Context, tx *sql.Tx) error {
		// The *sql.Tx is found through fn's context only, and only fn's
		// own *sql.Tx is: no registry answers for another context or tx.
		assert.ErrorIs(t, pgcore.OnCommit(ctx, tx, "SELECT 1"), pgcore.ErrNotGuardedTx, "a context that guard.Exec did not give fn")
		assert.ErrorIs(t, pgcore.OnCommit(fnCtx, plain, "SELECT 1"), pgcore.ErrNotGuardedTx, "another *sql.Tx under fn's context")
		assert.ErrorIs(t, pgcore.OnCommit[*sql.Tx](fnCtx, nil, "SELECT 1"), pgcore.ErrNotGuardedTx, "a nil *sql.Tx")
		err := pgcore.OnCommit(fnCtx, plain, "SELECT 1")
		assert.ErrorContains(t, err, "not the transaction of ctx's guard.Exec", "the message names the mix-up")
		err = pgcore.OnCommit(ctx, tx, "SELECT 1")
		assert.ErrorContains(t, err, "pass the ctx fn received", "the message names the fix")
		// fn's *sql.Tx held as an interface (sqlc's DBTX, GORM's
		// ConnPool, any) is found all the same.
		var dbtx interface {
			ExecContext(context.Context, string, ...any) (sql.Result, error)
		} = tx
		assert.NoError(t, pgcore.OnCommit(fnCtx, dbtx, "INSERT INTO queued (v) VALUES ($1)", "as DBTX"))
		assert.NoError(t, pgcore.OnCommit(fnCtx, any(tx), "INSERT INTO queued (v) VALUES ($1)", "as any"))
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, plain.Rollback())
	assert.EqualValues(t, 2, count(t, db, "SELECT count(*) FROM queued WHERE v IN ('as DBTX', 'as any')"))

	// A store that wraps sqlfence's without handing on its commit queue:
	// the refusal names the store's Txn, not the caller's transaction.
	_, err = guard.Exec(ctx, wrapped{s}, l, func(ctx context.Context, tx *sql.Tx) error {
		err := pgcore.OnCommit(ctx, tx, "SELECT 1")
		assert.ErrorIs(t, err, pgcore.ErrNotGuardedTx)
		assert.ErrorContains(t, err, "wrappedTxn, which has no commit queue")
		return nil
	})
	require.NoError(t, err)

	_, err = guard.Exec(ctx, s, l, func(ctx context.Context, tx *sql.Tx) error {
		require.NoError(t, pgcore.OnCommit(ctx, tx, "INSERT INTO queued (v) VALUES ($1)", "after raw commit"))
		_, err := tx.ExecContext(ctx, "COMMIT")
		return err
	})
	require.ErrorIs(t, err, guard.ErrTxEnded)
	assert.Zero(t, count(t, db, "SELECT count(*) FROM queued WHERE v = 'after raw commit'"), "nothing queued is sent outside the guarded transaction")
}

// wrapped is a store that decorates another (as tracing would) and hands
// on none of its Txn's optional methods.
type wrapped struct{ guard.Store[*sql.Tx] }

type wrappedTxn struct{ guard.Txn[*sql.Tx] }

func (w wrapped) Begin(ctx context.Context, c guard.Claim) (guard.Txn[*sql.Tx], error) {
	txn, err := w.Store.Begin(ctx, c)
	if err != nil {
		return nil, err
	}
	return wrappedTxn{txn}, nil
}
