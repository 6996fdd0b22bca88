package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/outbox"
	"github.com/fencelock/fencelock/testenv"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// outbox list shows the live rows with counts by state (exact on a small
// outbox: none reached the limit), --dead the dead ones with their reason; requeue makes the given (or all) dead rows due
// again, attempts reset.
func TestOutboxListRequeue(t *testing.T) {
	t.Parallel()
	// A receiver's answer, as HTTPSender records it: longer than a column,
	// and its cause at its end.
	const lastError = `POST https://shop.example/stock: 422 Unprocessable Entity: {"error": "unprocessable", "detail": "unknown sku"}`
	ctx := ctxT(t)
	db := migratedDB(t)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT fencelock.claim('stock:eu', 7, 'w1')`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT fencelock.outbox_add('[{"d":"https://shop.example/stock","k":"a"},{"d":"https://shop.example/stock","k":"b"},{"d":"https://mail.example","k":"c"}]')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	_, err = db.Pool.Exec(ctx, `UPDATE fencelock.outbox SET dead_at = now(), attempts = 20, last_error = '`+lastError+`' WHERE key IN ('a', 'b')`)
	require.NoError(t, err)

	code, out, errOut := fencectl(t, "outbox", "list", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "1 due, 0 waiting, 0 claimed, 2 dead")
	assert.Contains(t, out, "https://mail.example")
	assert.NotContains(t, out, "unknown sku")

	code, out, errOut = fencectl(t, "outbox", "list", "--dead", "--db", db.URL, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var got struct {
		Counts outbox.CappedCounts `json:"counts"`
		Rows   []outbox.Row        `json:"rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got.Rows, 2)
	assert.Equal(t, outbox.CappedCounts{Counts: outbox.Counts{Due: 1, Dead: 2}, Limit: outbox.DefaultBacklogLimit}, got.Counts)
	assert.Contains(t, out, `"counts": {
    "due": 1,
    "waiting": 0,
    "claimed": 0,
    "dead": 2,
    "limit": 10000,
    "capped": {
      "due": false,`)
	assert.Equal(t, "stock:eu", got.Rows[0].Resource)
	assert.EqualValues(t, 7, got.Rows[0].Token)
	assert.Contains(t, got.Rows[0].LastError, "unknown sku")
	assert.NotNil(t, got.Rows[0].Dead)

	code, out, errOut = fencectl(t, "outbox", "list", "--dead", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, lastError, "LAST ERROR whole, its cause at its end")
	assert.NotContains(t, out, "...")

	// An ID that is no dead row is an error: exit 1, after the others.
	code, out, errOut = fencectl(t, "outbox", "requeue", fmt.Sprint(got.Rows[0].ID), "999999", "--db", db.URL)
	require.Equal(t, exitFailed, code, errOut)
	assert.Equal(t, "requeued 1 dead row\n", out)
	assert.Equal(t, "fencectl: 1 ID of the 2 given is no dead row (no such row, delivered since, or never dead): left alone; fix: fencectl outbox list --dead lists the dead rows' IDs\n", errOut)
	code, out, _ = fencectl(t, "outbox", "requeue", "--all", "--db", db.URL)
	require.Equal(t, exitOK, code)
	assert.Equal(t, "requeued 1 dead row\n", out)
	var dead, attempts int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE dead_at IS NOT NULL), sum(attempts) FROM fencelock.outbox`).Scan(&dead, &attempts))
	assert.Zero(t, dead)
	assert.Zero(t, attempts)

	for args, want := range map[string]string{
		"requeue": "give the IDs of dead rows", "requeue --all 5": "give --all or IDs, not both",
		"requeue x": `"x" is not a row ID`, "list --limit 0": "--limit 0: want a positive number",
	} {
		code, _, errOut = fencectl(t, append(append([]string{"outbox"}, strings.Fields(args)...), "--db", db.URL)...)
		assert.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		assert.Contains(t, errOut, want, args)
	}
}

// A schema from before the outbox's counts (migration 5), and one from
// before the outbox itself: the fix is migrate up, and pasted as printed
// it works.
func TestOutboxNeedsMigration(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	for _, version := range []int64{4, 2} {
		t.Run(fmt.Sprint("version ", version), func(t *testing.T) {
			db := testenv.NewDB(t)
			sdb := stdlib.OpenDBFromPool(db.Pool)
			defer sdb.Close()
			p, err := goose.NewProvider(goose.DialectPostgres, sdb, migrations.FS(), goose.WithTableName(migrations.VersionTable))
			require.NoError(t, err)
			_, err = p.UpTo(ctx, version)
			require.NoError(t, err)

			code, _, errOut := fencectl(t, "outbox", "list", "--db", db.URL)
			assert.Equal(t, exitFailed, code)
			fix := "fencectl migrate up --db '" + db.URL + "'"
			assert.Contains(t, errOut, `the fencelock schema in database "`+db.Name+`" at `)
			assert.Contains(t, errOut, " is older than this fencectl needs; fix: "+fix)
			code, _, errOut = fencectl(t, "migrate", "up", "--db", db.URL) // the fix, as a shell reads it
			require.Equal(t, exitOK, code, errOut)
			code, out, errOut := fencectl(t, "outbox", "list", "--db", db.URL)
			require.Equal(t, exitOK, code, errOut)
			assert.Equal(t, "0 due, 0 waiting, 0 claimed, 0 dead\n", out)
		})
	}
}
