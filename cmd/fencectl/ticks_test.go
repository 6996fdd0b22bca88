package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ticks list reads jobs' ledgers and their ticks' runs: done, running,
// open, and the ticks no instance ran.
func TestTicksList(t *testing.T) {
	ctx := ctxT(t)
	db := migratedDB(t)
	_, err := db.Pool.Exec(ctx, `
INSERT INTO fencelock.runs (resource, run_key, token, cursor, finished, finished_at, updated_at) VALUES
  ('stock-sync', 'tick-ledger', 41, '{"v":1,"newest":"2026-05-10T12:05:00Z","token":41,"done":[{"at":"2026-05-10T12:00:00Z","token":40}],"missed":[{"first":"2026-05-10T11:30:00Z","last":"2026-05-10T11:45:00Z","count":4,"found":"2026-05-10T11:50:00Z"},{"first":"2026-05-10T11:55:00Z","last":"2026-05-10T11:55:00Z","count":1,"found":"2026-05-10T12:00:00Z"}]}', false, NULL, '2026-05-10T12:05:00.2Z'),
  ('stock-sync', '2026-05-10T12:05:00Z', 41, '3', false, NULL, '2026-05-10T12:05:03Z'),
  ('stock-sync', '2026-05-10T12:00:00Z', 40, '7', true, '2026-05-10T12:00:09Z', '2026-05-10T12:00:09Z'),
  ('stock-sync', '2026-05-10T11:50:00Z', 38, '7', true, '2026-05-10T11:50:08Z', '2026-05-10T11:50:08Z'),
  ('stock-sync', 'not-a-tick', 9, '', true, '2026-05-01T00:00:00Z', '2026-05-01T00:00:00Z'),
  ('report', 'tick-ledger', 7, '{"v":1,"newest":"2026-05-10T00:00:00Z","finished":true,"token":7}', false, NULL, '2026-05-10T00:00:01Z'),
  ('report', '2026-05-10T00:00:00Z', 7, '', true, '2026-05-10T00:00:01Z', '2026-05-10T00:00:01Z'),
  ('plain-run', 'batch-1', 3, '', true, '2026-05-01T00:00:00Z', '2026-05-01T00:00:00Z')`)
	require.NoError(t, err)

	code, out, errOut := fencectl(t, "ticks", "list", "--db", db.URL)
	require.Equal(t, exitOK, code, errOut)
	goldenFile(t, "ticks_list.golden", out, "TestTicksList")

	code, out, errOut = fencectl(t, "ticks", "list", "--db", db.URL, "--job", "stock-sync", "--limit", "2", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var jobs []jobJSON
	require.NoError(t, json.Unmarshal([]byte(out), &jobs), out)
	require.Len(t, jobs, 1)
	j := jobs[0]
	assert.Equal(t, "stock-sync", j.Job)
	assert.False(t, j.NewestFinished)
	require.Len(t, j.Ticks, 2, "--limit")
	assert.Equal(t, "running", j.Ticks[0].State)
	assert.Equal(t, "done", j.Ticks[1].State)
	require.Len(t, j.Missed, 2)
	assert.Equal(t, int64(1), j.Missed[0].Count, "newest first")
	assert.Equal(t, int64(4), j.Missed[1].Count)

	code, _, errOut = fencectl(t, "ticks", "list", "--db", db.URL, "--limit", "0")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "--limit 0")
}
