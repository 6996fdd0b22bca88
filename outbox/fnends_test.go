package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sqlStore is a sqlfence Store over db through pgx's database/sql driver.
func sqlStore(t *testing.T, db *testenv.DB) *sqlfence.Store {
	t.Helper()
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sdb.Close() })
	sq, err := sqlfence.New(sdb)
	require.NoError(t, err)
	return sq
}

// fnEndings are the two ways fn can end its *sql.Tx itself.
var fnEndings = map[string]func(ctx context.Context, tx *sql.Tx) error{
	"COMMIT as SQL": func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "COMMIT")
		return err
	},
	"Commit on the *sql.Tx": func(ctx context.Context, tx *sql.Tx) error { return tx.Commit() },
}

// deadRow is an outbox row's state.
type deadRow struct {
	Key       string
	Token     int64
	Dead      bool
	LastError string
}

func rowStates(t *testing.T, db *testenv.DB, resource string) []deadRow {
	t.Helper()
	rs, err := db.Pool.Query(ctxT(t), `SELECT key, token, dead_at IS NOT NULL, coalesce(last_error, '')
		FROM fencelock.outbox WHERE resource = $1 ORDER BY id`, resource)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rs, pgx.RowToStructByPos[deadRow])
	require.NoError(t, err)
	return out
}

// deadReason is what a row that fn committed itself says, in part.
const deadReason = "recorded by a guarded transaction whose commit did not pass its fence check"

// With sqlfence, the effects of a stale holder whose fn ends the
// transaction itself are never sent. Under token 1 a newer holder stores
// token 2 while fn runs; fn records ordered effects and ends the
// transaction (COMMIT as SQL, or Commit on its *sql.Tx): Exec returns
// guard.ErrTxEnded, and the rows commit dead, with the reason, listed by
// List(dead) and counted dead by Backlog. A relay sends the newer holder's
// ordered effect of the same resource (a dead row does not hold up the
// order) and never the stale ones; outbox_revive called by hand with
// their ids, by the newer holder's transaction, changes nothing (they are
// not its rows).
func TestAddSqlfenceStaleFnEndsTransaction(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	rc := newReceiver(t, nil)
	sq := sqlStore(t, db)
	for name, end := range fnEndings {
		res := "stale: " + name
		_, err := guard.Exec(ctx, sq, guardtest.Lease{Resource: res, Tok: 1, Who: "a"}, func(ctx context.Context, tx *sql.Tx) error {
			require.NoError(t, sq.Advance(context.WithoutCancel(ctx), guardtest.Lease{Resource: res, Tok: 2, Who: "b"}))
			e := effect(rc, res)
			e.Ordered = true
			if err := outbox.Add(ctx, tx, e); err != nil {
				return err
			}
			return end(ctx, tx)
		})
		require.ErrorIs(t, err, guard.ErrTxEnded, name)
		got := rowStates(t, db, res)
		require.Len(t, got, 1, name)
		assert.Equal(t, int64(1), got[0].Token, name)
		assert.True(t, got[0].Dead, "%s: committed dead", name)
		assert.Contains(t, got[0].LastError, deadReason, name)
	}
	dead, err := outbox.List(ctx, db.Pool, true, 10)
	require.NoError(t, err)
	require.Len(t, dead, 2)
	assert.Contains(t, dead[0].LastError, deadReason)
	c, err := outbox.Backlog(ctx, db.Pool, 0)
	require.NoError(t, err)
	assert.Equal(t, outbox.Counts{Dead: 2}, c.Counts)

	// Their ids revive nothing outside the transaction that recorded them.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT fencelock.claim('stale: COMMIT as SQL', 2, 'b')`)
	require.NoError(t, err)
	var closed int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT fencelock.outbox_revive(array_agg(id), 7) FROM fencelock.outbox`).Scan(&closed))
	assert.Equal(t, int64(7), closed, "outbox_revive returns close's result")
	require.NoError(t, tx.Commit(ctx))
	all, deadRows := rows(t, db.Pool)
	assert.Equal(t, []int{2, 2}, []int{all, deadRows}, "still dead")

	startRelay(t, db.Pool, httpSender(t), outbox.WithPollInterval(20*time.Millisecond))
	want := map[string]int{}
	for name := range fnEndings {
		res := "stale: " + name
		_, err = guard.Exec(ctx, sq, guardtest.Lease{Resource: res, Tok: 2, Who: "b"}, func(ctx context.Context, tx *sql.Tx) error {
			e := effect(rc, "current: "+name)
			e.Ordered = true
			return outbox.Add(ctx, tx, e)
		})
		require.NoError(t, err)
		want["current: "+name] = 1
	}
	eventually(t, func() bool { return len(rc.keys()) == len(want) }, "the newer holder's ordered effects, behind the dead ones")
	time.Sleep(200 * time.Millisecond) // several polls
	assert.Equal(t, want, rc.keys(), "nothing of the stale holder is sent")
	all, deadRows = rows(t, db.Pool)
	assert.Equal(t, []int{2, 2}, []int{all, deadRows}, "the dead rows stay")
}

// With sqlfence, the rows Add records inside SQL savepoints (GORM's nested
// transactions) that fn rolls back are gone, and their ids revive nothing:
// a commit makes live exactly the rows kept (outside a savepoint, or in
// one released), and a COMMIT sent by fn itself leaves exactly those rows
// dead.
func TestAddSQLSavepointSqlfence(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	sq := sqlStore(t, db)
	endings := map[string]func(ctx context.Context, tx *sql.Tx) error{
		"fn returns nil": func(context.Context, *sql.Tx) error { return nil },
		"COMMIT as SQL":  fnEndings["COMMIT as SQL"],
	}
	for name, end := range endings {
		res := "savepoints: " + name
		_, err := guard.Exec(ctx, sq, guardtest.Lease{Resource: res, Tok: 1, Who: "a"}, func(ctx context.Context, tx *sql.Tx) error {
			for _, step := range []struct {
				sql string
				key string
			}{
				{key: "kept"},
				{sql: "SAVEPOINT s1"},
				{key: "rolled-back"},
				{sql: "SAVEPOINT s2"},
				{key: "rolled-back-nested"},
				{sql: "ROLLBACK TO SAVEPOINT s1"},
				{sql: "SAVEPOINT s3"},
				{key: "released"},
				{sql: "RELEASE SAVEPOINT s3"},
			} {
				if step.sql != "" {
					if _, err := tx.ExecContext(ctx, step.sql); err != nil {
						return err
					}
					continue
				}
				if err := outbox.Add(ctx, tx, outbox.Effect{Destination: "d", Key: step.key}); err != nil {
					return err
				}
			}
			return end(ctx, tx)
		})
		dead := name != "fn returns nil"
		if dead {
			require.ErrorIs(t, err, guard.ErrTxEnded)
		} else {
			require.NoError(t, err)
		}
		var want []deadRow
		for _, k := range []string{"kept", "released"} {
			r := deadRow{Key: k, Token: 1, Dead: dead}
			if dead {
				r.LastError = rowStates(t, db, res)[0].LastError
				assert.Contains(t, r.LastError, deadReason)
			}
			want = append(want, r)
		}
		assert.Equal(t, want, rowStates(t, db, res), name)
	}
}
