package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// leaders list shows every election matching the pattern, leading or
// vacant, with its leader (or last term), value, lease left and
// candidates; plain locks are not elections.
func TestLeadersList(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedis(t)
	locks := newLocks(t, r)
	sched, err := locks.Election("scheduler:eu", fence.WithLease(time.Minute))
	require.NoError(t, err)
	term, err := sched.Campaign(ctx, "10.0.0.7:8080")
	require.NoError(t, err)
	defer term.Release(ctx)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = sched.Campaign(wctx, "standby") }()
	reports, err := locks.Election("scheduler:reports")
	require.NoError(t, err)
	gone, err := reports.Campaign(ctx, "old value")
	require.NoError(t, err)
	require.NoError(t, gone.Release(ctx))
	plain, err := locks.Acquire(ctx, "scheduler:plain")
	require.NoError(t, err)
	defer plain.Release(ctx)
	require.Eventually(t, func() bool {
		info, err := locks.Inspect(ctx, "scheduler:eu")
		return err == nil && info.Waiters == 1
	}, 10*time.Second, 5*time.Millisecond, "the standby candidate queued")

	code, out, errOut := fencectl(t, "leaders", "list", "--redis", r.Addr, "--prefix", r.Prefix, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var got []leaderJSON
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got, 2, out)
	assert.Equal(t, leaderJSON{Name: "scheduler:eu", Leading: true, Holder: term.Holder(), Token: term.Token(),
		Value: "10.0.0.7:8080", TTLMs: got[0].TTLMs, Candidates: 1}, got[0])
	assert.Greater(t, got[0].TTLMs, int64(0))
	assert.Equal(t, leaderJSON{Name: "scheduler:reports", Holder: gone.Holder(), Token: gone.Token(), Value: "old value",
		Ended: "resigned"}, got[1])

	code, out, errOut = fencectl(t, "leaders", "list", "scheduler:*", "--redis", r.Addr, "--prefix", r.Prefix)
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `NAME\s+STATE\s+HOLDER\s+TOKEN\s+VALUE\s+LEASE LEFT\s+CANDIDATES\n`, out)
	assert.Regexp(t, `scheduler:eu\s+leading\s+\S+\s+\d+\s+10\.0\.0\.7:8080\s+\S+\s+1\n`, out)
	assert.Regexp(t, `scheduler:reports\s+vacant, last term resigned\s+\S+\s+\d+\s+"old value"\s+-\s+0\n`, out)
	assert.NotContains(t, out, "scheduler:plain")

	code, out, _ = fencectl(t, "leaders", "list", "nothing-*", "--redis", r.Addr, "--prefix", r.Prefix)
	require.Equal(t, exitOK, code)
	assert.Equal(t, "no election matching \"nothing-*\" is known\n", out)
	code, _, errOut = fencectl(t, "leaders", "list", "a{b}", "--redis", r.Addr)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "without { or }")
}
