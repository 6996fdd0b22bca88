package inventory_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/lib/pq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// guard's store contract on sqlfence over lib/pq (the main module runs it
// over pgx's driver; lib/pq stays out of its go.mod).
func TestContractLibPQ(t *testing.T) {
	guardtest.Run(t, msgtest.Harness(func(t testing.TB) guardtest.Database[*sql.Tx] {
		url := newDB(t)
		return sqlDatabase{url: url, db: openDB(t, "postgres", url)}
	}))
}

// A stale write through lib/pq, by raw SQL (mapped by sqlfence's or
// pgfence's MapError) and through sqlfence, is errors.Is(err,
// guard.ErrStaleToken) with the figures.
func TestStaleThroughLibPQ(t *testing.T) {
	url := newDB(t)
	ctx := testCtx(t)
	db := openDB(t, "postgres", url)
	_, err := db.ExecContext(ctx, "SELECT fencelock.claim($1, $2, $3)", "r", 5, "b")
	require.NoError(t, err)

	_, err = db.ExecContext(ctx, "SELECT fencelock.claim($1, $2, $3)", "r", 4, "a")
	var pqErr *pq.Error
	require.ErrorAs(t, err, &pqErr, "lib/pq's own error type")
	assert.Equal(t, "FL001", pqErr.SQLState())
	var se *guard.StaleTokenError
	for _, mapped := range []error{sqlfence.MapError(err), pgfence.MapError(err)} {
		assert.ErrorIs(t, mapped, guard.ErrStaleToken)
		require.ErrorAs(t, mapped, &se)
		assert.Equal(t, guard.StaleTokenError{Resource: "r", Token: 4, Current: 5}, *se)
	}

	s, err := sqlfence.New(db)
	require.NoError(t, err)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 4, Who: "a"}, func(context.Context, *sql.Tx) error { return nil })
	assert.ErrorIs(t, err, guard.ErrStaleToken)
	require.ErrorAs(t, err, &se)
	assert.Equal(t, guard.StaleTokenError{Resource: "r", Token: 4, Current: 5}, *se)
}

// sqlDatabase is guardtest's view of a test database through database/sql
// with lib/pq.
type sqlDatabase struct {
	url string
	db  *sql.DB
}

func (d sqlDatabase) NewStore(t testing.TB) guard.Store[*sql.Tx] {
	s, err := sqlfence.New(openDB(t, "postgres", d.url))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (d sqlDatabase) Exec(ctx context.Context, q string, args ...any) error {
	_, err := d.db.ExecContext(ctx, q, args...)
	return err
}

func (d sqlDatabase) QueryInt(ctx context.Context, q string, args ...any) (n int64, err error) {
	err = d.db.QueryRowContext(ctx, q, args...).Scan(&n)
	return n, err
}

func (sqlDatabase) TxExec(ctx context.Context, tx *sql.Tx, q string, args ...any) error {
	_, err := tx.ExecContext(ctx, q, args...)
	return err
}

func (sqlDatabase) TxQueryInt(ctx context.Context, tx *sql.Tx, q string, args ...any) (n int64, err error) {
	err = tx.QueryRowContext(ctx, q, args...).Scan(&n)
	return n, err
}

func (sqlDatabase) TxCommit(_ context.Context, tx *sql.Tx) error { return tx.Commit() }
