package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
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

// deadRow is an outbox row's state: its key, token, whether it is dead
// and its last error.
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

// With sqlfence, the effects of a stale holder whose fn ends the
// transaction itself are never recorded, as with pgfence. Under token 1 a
// newer holder stores token 2 while fn runs; fn records ordered effects
// and ends the transaction (COMMIT as SQL, or Commit on its *sql.Tx):
// Exec returns guard.ErrTxEnded, and the outbox holds nothing of it,
// live or dead. The newer holder's ordered effects of the same resource
// are then delivered, and nothing of the stale holder's.
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
		assert.Empty(t, rowStates(t, db, res), name)
	}
	c, err := outbox.Backlog(ctx, db.Pool, 0)
	require.NoError(t, err)
	assert.Equal(t, outbox.Counts{}, c.Counts)

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
	eventually(t, func() bool { return len(rc.keys()) == len(want) }, "the newer holder's ordered effects")
	time.Sleep(200 * time.Millisecond) // several polls
	assert.Equal(t, want, rc.keys(), "nothing of the stale holder is sent")
}

// With either store, effects added inside savepoints made and rolled back
// in SQL (GORM's nested transactions) are recorded all the same when fn
// returns nil: no store reads fn's SQL, and the effects are written by
// the commit (a pgfence savepoint of tx.Begin does drop them: see
// TestAddSavepointPgfence). When fn sends COMMIT itself, none is
// recorded.
func TestAddSQLSavepoint(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	for _, s := range stores(t, db) {
		execSQL := func(ctx context.Context, tx any, q string) error {
			var err error
			switch tx := tx.(type) {
			case pgx.Tx:
				_, err = tx.Exec(ctx, q)
			case *sql.Tx:
				_, err = tx.ExecContext(ctx, q)
			}
			return err
		}
		for _, commitsItself := range []bool{false, true} {
			res := fmt.Sprintf("savepoints: %s, fn commits itself: %v", s.name, commitsItself)
			err := s.exec(ctx, guardtest.Lease{Resource: res, Tok: 1, Who: "a"}, func(ctx context.Context, tx any) error {
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
						if err := execSQL(ctx, tx, step.sql); err != nil {
							return err
						}
						continue
					}
					if err := add(ctx, tx, outbox.Effect{Destination: "d", Key: step.key}); err != nil {
						return err
					}
				}
				if commitsItself {
					return execSQL(ctx, tx, "COMMIT")
				}
				return nil
			})
			want := []deadRow{}
			if commitsItself {
				require.ErrorIs(t, err, guard.ErrTxEnded, res)
			} else {
				require.NoError(t, err, res)
				for _, k := range []string{"kept", "rolled-back", "rolled-back-nested", "released"} {
					want = append(want, deadRow{Key: k, Token: 1})
				}
			}
			assert.Equal(t, want, rowStates(t, db, res), res)
		}
	}
}
