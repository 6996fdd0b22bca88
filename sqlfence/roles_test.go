package sqlfence_test

import (
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/guard/guardtest"
	"github.com/fencelock/fencelock/internal/pgcore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An application role with only the grants docs/operations.md lists (USAGE on
// the schema, EXECUTE on its functions) runs everything of sqlfence, and
// cannot touch the fence table itself.
func TestApplicationRole(t *testing.T) {
	tdb, admin := newDB(t)
	ctx := testCtx(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role := pgx.Identifier{"fl_sqlapp_" + hex.EncodeToString(b)}.Sanitize()
	mustExec(t, admin, "CREATE ROLE "+role+" LOGIN NOSUPERUSER NOINHERIT")
	t.Cleanup(func() {
		_, _ = admin.Exec("DROP OWNED BY " + role)
		_, _ = admin.Exec("DROP ROLE IF EXISTS " + role)
	})
	mustExec(t, admin, "GRANT USAGE ON SCHEMA fencelock TO "+role)
	mustExec(t, admin, "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO "+role)
	mustExec(t, admin, "CREATE TABLE stock (sku text, writer text)")
	mustExec(t, admin, "GRANT INSERT, SELECT ON stock TO "+role)

	cfg, err := pgx.ParseConfig(tdb.URL)
	require.NoError(t, err)
	cfg.User = role[1 : len(role)-1]
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	s := newStore(t, db)

	_, err = guard.Exec(ctx, s, guardtest.Lease{Resource: "r", Tok: 1, Who: "a"}, insert("a"), guard.WithKey("k"))
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
