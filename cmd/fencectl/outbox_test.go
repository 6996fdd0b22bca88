package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/outbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// outbox list shows the live rows with counts by state, --dead the dead
// ones with their reason; requeue makes the given (or all) dead rows due
// again, attempts reset.
func TestOutboxListRequeue(t *testing.T) {
	ctx := ctxT(t)
	db := migratedDB(t)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT fencelock.claim('stock:eu', 7, 'w1')`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT fencelock.outbox_add('[{"d":"https://shop.example/stock","k":"a"},{"d":"https://shop.example/stock","k":"b"},{"d":"https://mail.example","k":"c"}]')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	_, err = db.Pool.Exec(ctx, `UPDATE fencelock.outbox SET dead_at = now(), attempts = 20, last_error = 'POST https://shop.example/stock: 422 Unprocessable Entity: unknown sku' WHERE key IN ('a', 'b')`)
	require.NoError(t, err)

	code, out, errOut := fencectl(t, "outbox", "list", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "1 due, 0 waiting, 0 claimed, 2 dead")
	assert.Contains(t, out, "https://mail.example")
	assert.NotContains(t, out, "unknown sku")

	code, out, errOut = fencectl(t, "outbox", "list", "--dead", "--db", db.URL, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var got struct {
		Counts outbox.Counts `json:"counts"`
		Rows   []outbox.Row  `json:"rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got.Rows, 2)
	assert.EqualValues(t, 2, got.Counts.Dead)
	assert.Equal(t, "stock:eu", got.Rows[0].Resource)
	assert.EqualValues(t, 7, got.Rows[0].Token)
	assert.Contains(t, got.Rows[0].LastError, "unknown sku")
	assert.NotNil(t, got.Rows[0].Dead)

	code, out, errOut = fencectl(t, "outbox", "requeue", fmt.Sprint(got.Rows[0].ID), "999999", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "requeued 1 dead rows")
	assert.Contains(t, out, "1 of the IDs given are not dead rows")
	code, out, _ = fencectl(t, "outbox", "requeue", "--all", "--db", db.URL)
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "requeued 1 dead rows")
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

// A schema from before the outbox migration: the fix is migrate up.
func TestOutboxNeedsMigration(t *testing.T) {
	ctx := ctxT(t)
	db := migratedDB(t)
	_, err := db.Pool.Exec(ctx, `DROP FUNCTION fencelock.outbox_counts()`)
	require.NoError(t, err)
	code, _, errOut := fencectl(t, "outbox", "list", "--db", db.URL)
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errOut, "fix: fencectl migrate up --db '"+db.URL+"'")
}
