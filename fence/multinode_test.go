package fence_test

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/fence"
)

// Helpers of the tests on multi-node deployments (Cluster, Sentinel).

// uniquePrefix is a key prefix of the test's own, for servers shared
// between tests.
func uniquePrefix(t testing.TB) string {
	return t.Name() + "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + ":"
}

// newFenceOn returns a fence client on rdb with prefix, closed at the end
// of the test.
func newFenceOn(t testing.TB, rdb redis.UniversalClient, prefix string, opts ...fence.ClientOption) *fence.Client {
	t.Helper()
	c, err := fence.New(rdb, append([]fence.ClientOption{fence.WithPrefix(prefix)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// namesPerMaster returns n lock names for each master of cc, keyed by the
// master's address: names whose keys (prefix+"{name}") hash to its slots.
func namesPerMaster(t testing.TB, cc *redis.ClusterClient, prefix, stem string, n int) map[string][]string {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	var count atomic.Int64 // ForEachMaster runs concurrently
	require.NoError(t, cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { count.Add(1); return nil }))
	masters := int(count.Load())
	out := map[string][]string{}
	for i, full := 0, 0; full < masters; i++ {
		require.Less(t, i, 100000, "no names found for every master")
		name := stem + strconv.Itoa(i)
		node, err := cc.MasterForKey(ctx, prefix+"{"+name+"}")
		require.NoError(t, err)
		a := node.Options().Addr
		if len(out[a]) < n {
			out[a] = append(out[a], name)
			if len(out[a]) == n {
				full++
			}
		}
	}
	return out
}

// shardSubscribers is the number of sharded subscribers of channel on
// node.
func shardSubscribers(ctx context.Context, node *redis.Client, channel string) int64 {
	v, err := node.Do(ctx, "PUBSUB", "SHARDNUMSUB", channel).Slice()
	if err != nil || len(v) != 2 {
		return -1
	}
	n, _ := v[1].(int64)
	return n
}

// waitDialProbes registers a cleanup, run after the test's clients are
// closed, that waits for go-redis's dial probes of dead nodes to end:
// each sleeps up to 1 s before it sees its closed pool, longer than the
// leak check at the end of the package waits.
func waitDialProbes(t *testing.T) {
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		buf := make([]byte, 1<<20)
		for time.Now().Before(deadline) {
			n := runtime.Stack(buf, true)
			if !bytes.Contains(buf[:n], []byte("(*ConnPool).tryDial")) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

type acquired struct {
	l   *fence.Lock
	err error
	at  time.Time
}
