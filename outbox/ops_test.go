package outbox_test

import (
	"context"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/fencelock/fencelock/guard"
	"github.com/fencelock/fencelock/internal/msgtest"
	"github.com/fencelock/fencelock/outbox"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// backlogStates records rows in every state and returns how many of each:
// unordered ones due, backing off, claimed; ordered ones due and claimed;
// dead ones.
func backlogStates(t *testing.T, pool *pgxpool.Pool) outbox.Counts {
	t.Helper()
	ctx := ctxT(t)
	var effects []outbox.Effect
	for _, k := range []string{"due-1", "due-2", "due-3", "waiting-1", "waiting-2", "claimed-1", "dead-1", "dead-2", "dead-3"} {
		effects = append(effects, outbox.Effect{Destination: "d", Key: k})
	}
	for _, k := range []string{"odue-1", "odue-2", "oclaimed-1"} {
		effects = append(effects, outbox.Effect{Destination: "d", Key: k, Ordered: true})
	}
	require.NoError(t, raw(ctx, pool, "r", 1, "h", effects...))
	for _, q := range []string{
		`UPDATE fencelock.outbox SET due_at = now() + interval '1 hour', attempts = 1 WHERE key LIKE 'waiting-%'`,
		`UPDATE fencelock.outbox SET due_at = now() + interval '1 hour', claim = 7 WHERE key LIKE '%claimed-%'`,
		`UPDATE fencelock.outbox SET dead_at = now() WHERE key LIKE 'dead-%'`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	return outbox.Counts{Due: 5, Waiting: 2, Claimed: 2, Dead: 3}
}

// Backlog counts what Count counts, each count exact below its limit; a
// count that may be short says so: the due rows past the limit, every
// state read from a range cut short at the limit (rows due later for
// waiting and claimed, ordered rows for the three live states, dead
// rows), and a count over the limit, reported at the limit.
func TestBacklog(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	want := backlogStates(t, db.Pool)
	exact, err := outbox.Count(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, want, exact)

	for _, tc := range []struct {
		limit  int
		counts outbox.Counts
		capped outbox.Capped
	}{
		{0, want, outbox.Capped{}},
		{100, want, outbox.Capped{}},
		{5, want, outbox.Capped{}},
		// Ranges of 3 (unordered due, due later, ordered, dead), within the
		// limit, but 3 + 2 due rows over it.
		{3, outbox.Counts{Due: 3, Waiting: 2, Claimed: 2, Dead: 3}, outbox.Capped{Due: true}},
		// Every range is cut short.
		{2, outbox.Counts{Due: 2, Waiting: 2, Claimed: 2, Dead: 2}, outbox.Capped{Due: true, Waiting: true, Claimed: true, Dead: true}},
		{1, outbox.Counts{Due: 1, Waiting: 1, Claimed: 0, Dead: 1}, outbox.Capped{Due: true, Waiting: true, Claimed: true, Dead: true}},
	} {
		got, err := outbox.Backlog(ctx, db.Pool, tc.limit)
		require.NoError(t, err, "limit %d", tc.limit)
		limit := tc.limit
		if limit == 0 {
			limit = outbox.DefaultBacklogLimit
		}
		assert.Equal(t, outbox.CappedCounts{Counts: tc.counts, Limit: limit, Capped: tc.capped}, got, "limit %d", tc.limit)
	}

	for _, limit := range []int{-1, 1 << 31} {
		_, err := outbox.Backlog(ctx, db.Pool, limit)
		require.ErrorIs(t, err, outbox.ErrInvalidOption)
		assert.Equal(t, "outbox: invalid option: Backlog limit "+strconv.Itoa(limit)+": give 1 to 2147483647, or 0 for the default (10000)", err.Error())
	}
	_, err = outbox.Backlog(ctx, nil, 0)
	require.ErrorIs(t, err, outbox.ErrNilDB)
	_, err = db.Pool.Exec(ctx, `SELECT fencelock.outbox_backlog(0)`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "22023", pgErr.Code)
	assert.Equal(t, "fencelock: outbox_backlog: a limit >= 1 is required", pgErr.Message)
}

// A role whose EXECUTE grant predates outbox_backlog (granted on all
// functions before migration 5 added it) is told the GRANT to repeat, and
// the GRANT as printed works; a schema from before migration 5 is
// refused as the stores refuse it, with the command that migrates it.
func TestBacklogNeedsMigration(t *testing.T) {
	db := newDB(t)
	ctx := ctxT(t)
	role := "fl_backlog_" + strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN NOSUPERUSER NOINHERIT`,
		`GRANT USAGE ON SCHEMA fencelock TO ` + role,
		`GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO ` + role,
		`REVOKE EXECUTE ON FUNCTION fencelock.outbox_backlog(integer) FROM ` + role,
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	owner := u.User.Username()
	u.User = url.User(role)
	app, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(app.Close)
	_, err = outbox.Count(ctx, app)
	require.NoError(t, err, "the functions of migration 3 are granted")
	_, err = outbox.Backlog(ctx, app, 0)
	require.Error(t, err)
	assert.ErrorIs(t, err, guard.ErrPermission)
	assert.Equal(t, `outbox: backlog: role "`+role+`" lacks EXECUTE on function fencelock.outbox_backlog, so nothing was written: as the schema's owner (role "`+owner+`"), run in database "`+db.Name+`":`+
		` psql -U `+owner+` -d `+db.Name+` -c 'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fencelock TO `+role+`; ALTER DEFAULT PRIVILEGES FOR ROLE `+owner+` IN SCHEMA fencelock GRANT EXECUTE ON FUNCTIONS TO `+role+`;'`, err.Error())
	for _, stmt := range msgtest.ParsePsql(t, err.Error()).SQL {
		_, err = db.Pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	_, err = outbox.Backlog(ctx, app, 0)
	require.NoError(t, err, "after the GRANT")

	// Version 4: no outbox_backlog yet.
	for _, q := range []string{
		`DROP FUNCTION fencelock.outbox_backlog(integer)`,
		`CREATE OR REPLACE FUNCTION fencelock.schema_version() RETURNS bigint LANGUAGE sql STABLE AS $$ SELECT 4::bigint $$`,
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	_, err = outbox.Backlog(ctx, db.Pool, 0)
	require.ErrorIs(t, err, guard.ErrSchemaOutdated)
	assert.NotContains(t, err.Error(), "\n")
	assert.Contains(t, err.Error(), `outbox: backlog: fencelock schema out of date: schema fencelock in database "`+db.Name+`" is at version 4 and this fencelock needs 5: run migrations.Up(ctx, db) at start-up, or: fencectl migrate up --db 'postgres://`)
}
