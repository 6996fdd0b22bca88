package sqlfence_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/fencelock/fencelock/sqlfence"
	"github.com/fencelock/fencelock/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// appRole creates a login role with the grants docs/operations.md gives
// an application (msgtest.AppGrants) and returns its name and a
// database/sql handle connected as it.
func appRole(t *testing.T, tdb *testenv.DB) (string, *sql.DB) {
	t.Helper()
	role, roleURL := msgtest.NewAppRole(t, tdb)
	return role, openDB(t, "pgx", roleURL)
}

// An application role with only the grants docs/operations.md lists (USAGE on
// the schema, EXECUTE on its functions) runs everything of sqlfence, and
// cannot touch the fence table itself.
func TestApplicationRole(t *testing.T) {
	tdb, admin := newDB(t)
	ctx := testCtx(t)
	role, db := appRole(t, tdb)
	mustExec(t, admin, "CREATE TABLE stock (sku text, writer text)")
	mustExec(t, admin, "GRANT INSERT, SELECT ON stock TO "+role)
	s := newStore(t, db)

	_, err := guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insert("a"), guard.WithKey("k"))
	require.NoError(t, err)
	require.NoError(t, s.Advance(ctx, guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}))
	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insert("a"))
	require.ErrorIs(t, err, guard.ErrStaleToken)
	run := s.Run(guardtest.Lease{Resource: "r", Tok: 2, Who: "b"}, "run")
	require.NoError(t, run.Step(ctx, "10", insert("b")))
	cursor, finished, err := run.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, "10", cursor)
	assert.False(t, finished)
	require.NoError(t, run.Finish(ctx))
	_, err = s.Prune(ctx, time.Hour)
	require.NoError(t, err)

	for _, q := range []string{
		"UPDATE fencelock.fence SET token = 1",
		"DELETE FROM fencelock.applied",
		"SELECT token FROM fencelock.fence FOR SHARE",
	} {
		_, err := db.ExecContext(ctx, q)
		require.Error(t, err, q)
		assert.Equal(t, "42501", pgcore.Code(err), "%s: insufficient_privilege", q)
	}
	assert.EqualValues(t, 2, count(t, admin, "SELECT token FROM fencelock.fence WHERE resource = 'r'"))
	assert.EqualValues(t, 2, count(t, admin, "SELECT count(*) FROM stock"))

}

// A role with the documented grants less one is refused by guard.Exec,
// Advance and Prune with the message pgfence gives (one mapping for every
// store); run as printed, the fix works (msgtest.WalkMissingGrants).
func TestRoleWithoutAGrant(t *testing.T) {
	tdb, _ := newDB(t)
	msgtest.WalkMissingGrants[*sql.Tx, sqlfence.Run](t, tdb, "sqlfence", func(t *testing.T, roleURL string) *sqlfence.Store {
		return newStore(t, openDB(t, "pgx", roleURL))
	})
}
