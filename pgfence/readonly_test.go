package pgfence_test

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/pgfence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A read-only database is honoured: no fn runs, nothing is written, and
// the error names the setting; guard.Exec and Run.Step do not commit
// where a plain INSERT fails with 25006.
func TestReadOnlyDatabase(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	require.NoError(t, newStore(t, db.Pool).Advance(ctx, guardtest.Lease{Resource: "known", Tok: 1, Who: "a"}))
	mustExec(t, db.Pool, "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" SET default_transaction_read_only = on")
	ro, err := pgxpool.New(ctx, db.URL) // new sessions get the setting
	require.NoError(t, err)
	t.Cleanup(ro.Close)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = ro.Exec(ctx, "INSERT INTO stock VALUES ('plain', 1, 'plain')")
	require.Error(t, err, "a plain INSERT is refused: the setting is in force")

	for name, s := range map[string]*pgfence.Store{"pool": newStore(t, ro), "conn": newStore(t, conn), "generic": newStore(t, wrappedDB{ro})} {
		t.Run(name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				require.ErrorIs(t, err, guard.ErrReadOnly, what)
				assert.Contains(t, err.Error(), "default_transaction_read_only", what)
				assert.NotContains(t, err.Error(), "\n", what)
			}
			ran := false
			fn := func(ctx context.Context, tx pgx.Tx) error {
				ran = true
				return insertStock("ro", 1)(ctx, tx)
			}
			for _, l := range []guardtest.Lease{{Resource: "new", Tok: 5, Who: "a"}, {Resource: "known", Tok: 1, Who: "a"}} {
				_, err := guard.Exec(ctx, s, l, fn, guard.WithKey("k"))
				check("Exec "+l.Resource, err)
				_, err = guard.Exec(ctx, s, l, fn)
				check("Exec again "+l.Resource, err) // the advance cache is not filled by a refusal
				check("Step "+l.Resource, s.Run(l, "run").Step(ctx, "1", fn))
				check("Finish "+l.Resource, s.Run(l, "run").Finish(ctx))
			}
			check("Advance", s.Advance(ctx, guardtest.Lease{Resource: "new", Tok: 6, Who: "a"}))
			_, err := s.Prune(ctx, 0)
			check("Prune", err)
			assert.False(t, ran, "fn must not run on a read-only database")
		})
	}
	// Nothing was written: no rows, no new fence, no key, no run.
	assert.Zero(t, count(t, db.Pool, "SELECT count(*) FROM stock"))
	assert.EqualValues(t, 1, count(t, db.Pool, "SELECT count(*) FROM fencelock.fence"))
	assert.EqualValues(t, 1, storedToken(t, db.Pool, "known"))
	assert.Zero(t, count(t, db.Pool, "SELECT count(*) FROM fencelock.applied"))
	assert.Zero(t, count(t, db.Pool, "SELECT count(*) FROM fencelock.runs"))
}

// A session whose transactions default to read-only (SET SESSION
// CHARACTERISTICS, what a read-only role setting does) is refused the
// same way.
func TestReadOnlySession(t *testing.T) {
	db := newDB(t)
	stockTable(t, db.Pool)
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
	require.NoError(t, err)
	s := newStore(t, conn)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insertStock("ro", 1))
	require.ErrorIs(t, err, guard.ErrReadOnly)
	assert.Contains(t, err.Error(), "default_transaction_read_only")
	assert.Zero(t, count(t, db.Pool, "SELECT count(*) FROM stock"))
	assert.Zero(t, count(t, db.Pool, "SELECT count(*) FROM fencelock.fence"))
	// The session is idle and usable afterwards.
	assert.EqualValues(t, 'I', conn.PgConn().TxStatus())
	_, err = conn.Exec(ctx, "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE")
	require.NoError(t, err)
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insertStock("rw", 1))
	require.NoError(t, err)
}
