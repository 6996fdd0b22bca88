package main

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// locks list shows exactly the held locks (not released ones, not the
// counters, not other prefixes' keys), with holder, token and remaining
// lease, filtered by a glob over names.
func TestLocksList(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedis(t)
	locks := newLocks(t, r, fence.WithLease(time.Minute))
	var held []*fence.Lock
	for _, n := range []string{"stock-sync:eu", "stock-sync:us", "report"} {
		l, err := locks.Acquire(ctx, n)
		require.NoError(t, err)
		held = append(held, l)
	}
	gone, err := locks.Acquire(ctx, "stock-sync:released")
	require.NoError(t, err)
	require.NoError(t, gone.Release(ctx))
	// Another prefix's lock, and a key under the prefix that is no lock.
	other, err := fence.New(r.Client(), fence.WithPrefix(r.Prefix+"x:"))
	require.NoError(t, err)
	defer other.Close(ctx)
	ol, err := other.Acquire(ctx, "stock-sync:eu")
	require.NoError(t, err)
	defer ol.Release(ctx)
	require.NoError(t, r.Client().HSet(ctx, r.Prefix+"{notalock}", "f", "v").Err())

	code, out, errOut := fencectl(t, "locks", "list", "--redis", r.Addr, "--prefix", r.Prefix, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var got []heldLockJSON
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got, 3, out)
	byName := map[string]*fence.Lock{"report": held[2], "stock-sync:eu": held[0], "stock-sync:us": held[1]}
	for i, name := range []string{"report", "stock-sync:eu", "stock-sync:us"} {
		assert.Equal(t, name, got[i].Name, "sorted by name")
		assert.Equal(t, byName[name].Holder(), got[i].Holder)
		assert.Equal(t, byName[name].Token(), got[i].Token)
		assert.Greater(t, got[i].TTLMs, int64(0))
		assert.LessOrEqual(t, got[i].TTLMs, time.Minute.Milliseconds())
		assert.Empty(t, got[i].Node)
	}

	code, out, errOut = fencectl(t, "locks", "list", "stock-sync:*", "--redis", r.Addr, "--prefix", r.Prefix)
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `NAME\s+HOLDER\s+TOKEN\s+LEASE LEFT\n`, out)
	assert.Contains(t, out, "stock-sync:eu")
	assert.Contains(t, out, held[1].Holder())
	assert.NotContains(t, out, "report")
	assert.NotContains(t, out, "released")

	code, out, _ = fencectl(t, "locks", "list", "nothing-*", "--redis", r.Addr, "--prefix", r.Prefix)
	require.Equal(t, exitOK, code)
	assert.Equal(t, "no lock matching \"nothing-*\" is held\n", out)
	code, out, _ = fencectl(t, "locks", "list", "nothing-*", "--redis", r.Addr, "--prefix", r.Prefix, "-o", "json")
	require.Equal(t, exitOK, code)
	assert.Equal(t, "[]\n", out)

	code, _, errOut = fencectl(t, "locks", "list", "a{b}", "--redis", r.Addr)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "without { or }")
}

// A prefix with glob characters matches only itself.
func TestLocksListPrefixIsLiteral(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := testenv.NewRedisServer(t)
	lit, err := fence.New(r.Client(), fence.WithPrefix("jobs[eu]:"))
	require.NoError(t, err)
	defer lit.Close(ctx)
	l, err := lit.Acquire(ctx, "a")
	require.NoError(t, err)
	defer l.Release(ctx)
	near, err := fence.New(r.Client(), fence.WithPrefix("jobse:"))
	require.NoError(t, err)
	defer near.Close(ctx)
	nl, err := near.Acquire(ctx, "b")
	require.NoError(t, err)
	defer nl.Release(ctx)

	code, out, errOut := fencectl(t, "locks", "list", "--redis", r.Addr, "--prefix", "jobs[eu]:", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var got []heldLockJSON
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got, 1, out)
	assert.Equal(t, "a", got[0].Name)
}

// On a cluster, list scans every master and says which one holds each lock.
func TestLocksListCluster(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	c := testenv.NewRedisCluster(t, testenv.WithMasters(2), testenv.WithReplicas(0))
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{c.Nodes[0].Addr}})
	defer rdb.Close()
	locks, err := fence.New(rdb)
	require.NoError(t, err)
	defer locks.Close(ctx)
	// Two locks on each master.
	names := map[string]string{} // name → master address
	perMaster := map[string]int{}
	for i := 0; len(names) < 4; i++ {
		name := fmt.Sprintf("job-%d", i)
		m, err := c.MasterFor(ctx, lockKey("fence:", name))
		require.NoError(t, err)
		if perMaster[m.Addr] == 2 {
			continue
		}
		perMaster[m.Addr]++
		l, err := locks.Acquire(ctx, name)
		require.NoError(t, err)
		defer l.Release(ctx)
		names[name] = m.Addr
	}
	require.Len(t, perMaster, 2)

	code, out, errOut := fencectl(t, "locks", "list", "--redis", c.Nodes[1].Addr, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var got []heldLockJSON
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got, len(names), out)
	for _, h := range got {
		assert.Equal(t, names[h.Name], h.Node, h.Name)
	}
	code, out, _ = fencectl(t, "locks", "list", "--redis", c.Nodes[0].Addr)
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `NAME\s+HOLDER\s+TOKEN\s+LEASE LEFT\s+NODE\n`, out)
}
