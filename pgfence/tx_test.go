package pgfence_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkInvariant asserts the promise of every Exec: err == nil if and
// only if fn's rows are visible, and every message is one line.
func checkInvariant(t *testing.T, err error, visible int64) {
	t.Helper()
	if err == nil {
		assert.Positive(t, visible, "Exec returned nil but fn's rows are not there")
		return
	}
	assert.NotContains(t, err.Error(), "\n", "one-line error")
	if errors.Is(err, guard.ErrTxEnded) || errors.Is(err, guard.ErrUnknownOutcome) {
		return // the error says the rows may be there
	}
	assert.Zero(t, visible, "Exec returned %v but fn's rows were committed", err)
}

// fn calls tx.Commit or tx.Rollback: the tx refuses (ErrTxOwned) and
// leaves the transaction alone: a newer holder that advanced meanwhile
// still refuses the commit, and the row is not there.
func TestTxCommitAndRollbackAreRefused(t *testing.T) {
	onBothPaths(t, func(t *testing.T, db *testenv.DB, pool *pgxpool.Pool) {
		stockTable(t, db.Pool)
		s := newStore(t, pool)
		ctx := testCtx(t)

		for i, end := range []func(pgx.Tx) error{
			func(tx pgx.Tx) error { return tx.Commit(ctx) },
			func(tx pgx.Tx) error { return tx.Rollback(ctx) },
		} {
			// fn ignores the refusal, a newer holder advances meanwhile: the
			// claim at commit refuses, and nothing is visible.
			writer := []string{"commit", "rollback"}[i]
			_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: writer, Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
				if err := insertStock(writer, 1)(ctx, tx); err != nil {
					return err
				}
				require.ErrorIs(t, end(tx), guard.ErrTxOwned)
				if err := newStore(t, db.Pool).Advance(ctx, guardtest.Lease{Resource: writer, Tok: 2, Who: "b"}); err != nil {
					return err
				}
				return insertStock(writer, 1)(ctx, tx) // still in the transaction
			})
			require.ErrorIs(t, err, guard.ErrStaleToken)
			checkInvariant(t, err, rowsBy(t, db.Pool, writer))

			// fn returns the refusal: rolled back, and the error says why.
			_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: writer, Tok: 2, Who: "b"}, func(ctx context.Context, tx pgx.Tx) error {
				if err := insertStock(writer, 1)(ctx, tx); err != nil {
					return err
				}
				return end(tx)
			})
			require.ErrorIs(t, err, guard.ErrTxOwned)
			checkInvariant(t, err, rowsBy(t, db.Pool, writer))

			// fn ignores it and returns nil: committed, with the check.
			_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: writer, Tok: 2, Who: "b"}, func(ctx context.Context, tx pgx.Tx) error {
				if err := insertStock(writer, 1)(ctx, tx); err != nil {
					return err
				}
				_ = end(tx)
				return nil
			})
			require.NoError(t, err)
			checkInvariant(t, err, rowsBy(t, db.Pool, writer))
		}
	})
}

// fn sends its own COMMIT or ROLLBACK through Exec: the rows may be
// committed without the fence check, and Exec says so (ErrTxEnded)
// instead of nil (COMMIT) or "nothing was written".
func TestRawCommitInFnIsReported(t *testing.T) {
	onBothPaths(t, func(t *testing.T, db *testenv.DB, pool *pgxpool.Pool) {
		stockTable(t, db.Pool)
		s := newStore(t, pool)
		ctx := testCtx(t)

		for _, tc := range []struct {
			name, sql string
			fnErr     bool
			committed bool
		}{
			{"COMMIT", "COMMIT", false, true},
			{"ROLLBACK", "ROLLBACK", false, false},
			{"COMMIT then fn fails", "COMMIT", true, true},
			{"COMMIT; BEGIN", "COMMIT; BEGIN", false, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				writer := tc.name
				boom := errors.New("boom")
				_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
					if err := insertStock(writer, 1)(ctx, tx); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, tc.sql); err != nil {
						return err
					}
					if tc.fnErr {
						return boom
					}
					return nil
				}, guard.WithKey(writer))
				require.ErrorIs(t, err, guard.ErrTxEnded)
				assert.Contains(t, err.Error(), "may have committed without the fence check")
				if tc.fnErr {
					require.ErrorIs(t, err, boom)
				}
				want := int64(0)
				if tc.committed {
					want = 1
				}
				assert.Equal(t, want, rowsBy(t, db.Pool, writer))
				assert.Zero(t, count(t, db.Pool, "SELECT count(*) FROM fencelock.applied WHERE key = $1", writer), "the key is recorded only by a fenced commit")
				checkInvariant(t, err, rowsBy(t, db.Pool, writer))
			})
		}
		// The pool's connections are clean afterwards.
		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insertStock("after", 1))
		require.NoError(t, err)
	})
}

// fn lets a statement fail and returns nil: the transaction is aborted,
// nothing is committed, and Exec says so.
func TestSwallowedErrorInFn(t *testing.T) {
	onBothPaths(t, func(t *testing.T, db *testenv.DB, pool *pgxpool.Pool) {
		stockTable(t, db.Pool)
		s := newStore(t, pool)
		ctx := testCtx(t)
		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
			if err := insertStock("x", 1)(ctx, tx); err != nil {
				return err
			}
			_, _ = tx.Exec(ctx, "INSERT INTO no_such_table VALUES (1)")
			return nil
		})
		require.ErrorIs(t, err, pgx.ErrTxCommitRollback)
		checkInvariant(t, err, rowsBy(t, db.Pool, "x"))
	})
}

// tx.Begin makes a savepoint, as pgx's Tx does; it commits and rolls back
// on its own, and the outer transaction still commits with the check.
func TestSavepointInFn(t *testing.T) {
	onBothPaths(t, func(t *testing.T, db *testenv.DB, pool *pgxpool.Pool) {
		stockTable(t, db.Pool)
		s := newStore(t, pool)
		ctx := testCtx(t)
		_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
			if err := insertStock("outer", 1)(ctx, tx); err != nil {
				return err
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := insertStock("dropped", 1)(ctx, sp); err != nil {
				return err
			}
			if err := sp.Rollback(ctx); err != nil {
				return err
			}
			sp, err = tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := insertStock("kept", 1)(ctx, sp); err != nil {
				return err
			}
			return pgx.BeginFunc(ctx, sp, func(nested pgx.Tx) error { return insertStock("nested", 1)(ctx, nested) })
		})
		require.NoError(t, err)
		assert.EqualValues(t, 1, rowsBy(t, db.Pool, "outer"))
		assert.EqualValues(t, 0, rowsBy(t, db.Pool, "dropped"))
		assert.EqualValues(t, 1, rowsBy(t, db.Pool, "kept"))
		assert.EqualValues(t, 1, rowsBy(t, db.Pool, "nested"))
	})
}

// Everything a pgx.Tx offers works in fn: batches, COPY, queries, large
// objects, Conn.
func TestTxMethodsInFn(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	var oid uint32
	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue("INSERT INTO stock VALUES ('b1', 1, 'batch')")
		b.Queue("INSERT INTO stock VALUES ('b2', 1, 'batch')")
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"stock"}, []string{"sku", "qty", "writer"},
			pgx.CopyFromRows([][]any{{"c1", 1, "copy"}})); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM stock").Scan(&n); err != nil || n != 3 {
			return errors.Join(err, errors.New("fn does not see its own rows"))
		}
		rows, err := tx.Query(ctx, "SELECT sku FROM stock ORDER BY sku")
		if err != nil {
			return err
		}
		skus, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || strings.Join(skus, ",") != "b1,b2,c1" {
			return errors.Join(err, errors.New("Query in fn"))
		}
		if tx.Conn() == nil {
			return errors.New("Conn is nil")
		}
		lo := tx.LargeObjects()
		if oid, err = lo.Create(ctx, 0); err != nil {
			return err
		}
		obj, err := lo.Open(ctx, oid, pgx.LargeObjectModeWrite)
		if err != nil {
			return err
		}
		_, err = obj.Write([]byte("fenced"))
		return err
	})
	require.NoError(t, err)
	assert.EqualValues(t, 2, rowsBy(t, db.Pool, "batch"))
	assert.EqualValues(t, 1, rowsBy(t, db.Pool, "copy"))
	var data []byte
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT lo_get($1)", oid).Scan(&data))
	assert.Equal(t, "fenced", string(data))
}

// cutAfterCommit is a connection that, once armed, lets the next write
// (the commit round trip) reach the server and then closes: the client
// loses the answer of a commit that the server received.
type cutAfterCommit struct {
	net.Conn
	armed *atomic.Bool
}

func (c cutAfterCommit) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if c.armed.Load() && (bytes.Contains(b, []byte("fencelock.close")) || bytes.Contains(b, []byte("fencelock_close_"))) {
		c.armed.Store(false)
		_ = c.Conn.Close()
	}
	return n, err
}

// The connection dies while the commit is in flight: the outcome is
// unknown, and Exec says so (ErrUnknownOutcome), never "nothing was
// written". A retry with the same key tells what happened.
func TestCommitInFlightWhenConnectionDies(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	var armed atomic.Bool
	conn := connThrough(t, db.URL, func(c net.Conn) net.Conn { return cutAfterCommit{Conn: c, armed: &armed} })
	s := newStore(t, conn)

	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, func(ctx context.Context, tx pgx.Tx) error {
		armed.Store(true)
		return insertStock("inflight", 1)(ctx, tx)
	}, guard.WithKey("k"))
	require.ErrorIs(t, err, guard.ErrUnknownOutcome)
	assert.NotContains(t, err.Error(), "nothing was written")
	checkInvariant(t, err, rowsBy(t, db.Pool, "inflight"))

	// The retry (a new connection) tells: the key was applied, or the
	// batch applies now; either way exactly one copy.
	_, err = guard.Exec(ctx, newStore(t, db.Pool), guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insertStock("inflight", 1), guard.WithKey("k"))
	if err != nil {
		require.ErrorIs(t, err, guard.ErrAlreadyApplied)
	}
	assert.EqualValues(t, 1, rowsBy(t, db.Pool, "inflight"))
}

// An error of a protect trigger inside a run's step comes back typed
// (runStore maps fn's errors as the Store does).
func TestRunStepMapsProtectRefusal(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	s := newStore(t, db.Pool)
	ctx := testCtx(t)
	require.NoError(t, s.Protect(ctx, "stock", pgfence.ForResource("stock:eu")))
	err := s.Run(guardtest.Lease{Resource: "other", Tok: 1, Who: "a"}, "run").Step(ctx, "1", insertStock("x", 1))
	require.ErrorIs(t, err, guard.ErrNotClaimed)
	checkInvariant(t, err, rowsBy(t, db.Pool, "x"))
}
