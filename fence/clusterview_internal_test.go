package fence

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/testenv"
)

// TestClusterViewBoundTooShort: a node that does not answer within the
// bound has each slot-map read given up at the bound, with a timeout that
// says what was given up; a bound no node can meet (a slow network) must
// not leave the map stale for good: after escapeAfter timeouts in a row,
// the next read waits as long as the node allows. The node is a cluster
// node behind a proxy that forwards nothing (a stopped node, as far as
// its client can tell).
func TestClusterViewBoundTooShort(t *testing.T) {
	t.Parallel()
	cl := testenv.SharedRedisCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	p, err := testenv.NewProxy(cl.Nodes[0].Addr)
	require.NoError(t, err)
	defer p.Close()
	const readTimeout = 2 * time.Second
	node := redis.NewClient(&redis.Options{Addr: p.Addr, ReadTimeout: readTimeout, MaxRetries: -1})
	defer node.Close()
	v := &clusterView{bound: 50 * time.Millisecond, hooked: map[*redis.Client]bool{}}
	v.hook(node)
	require.NoError(t, node.Ping(ctx).Err())

	p.Blackhole()
	for i := range escapeAfter {
		start := time.Now()
		err := node.ClusterSlots(ctx).Err() //lint:ignore SA1019 the read go-redis makes of its slot map
		var timeout *layoutReadTimeout
		require.True(t, errors.As(err, &timeout), "read %d fails with the bound's timeout, got %v", i, err)
		assert.Less(t, time.Since(start), readTimeout, "given up at the bound, not at the read timeout")
		assert.Equal(t, "fence: CLUSTER SLOTS got no answer within 50ms (the node may be stopped); another node is asked", err.Error())
		assert.True(t, timeout.Timeout(), "a net.Error that timed out, as the node's own read timeout")
	}
	// The next read escapes the bound: it waits for the node's own
	// timeout, which a node that answers would have met.
	start := time.Now()
	err = node.ClusterSlots(ctx).Err() //lint:ignore SA1019 the read go-redis makes of its slot map
	require.Error(t, err)
	assert.False(t, errors.As(err, new(*layoutReadTimeout)), "unbounded: the node's own timeout, got %v", err)
	assert.GreaterOrEqual(t, time.Since(start), readTimeout)

	// The node answers again: the read is bounded once more (the count
	// below the escape, so the bounded path reads), and answered within a
	// bound a loaded machine meets, through a client whose own read
	// timeout is as long (50 ms did not, once; 2 s did not, once, under
	// the whole suite's load); an answer resets the count.
	p.Restore()
	const answered = 15 * time.Second
	again := redis.NewClient(&redis.Options{Addr: p.Addr, ReadTimeout: answered, MaxRetries: -1})
	defer again.Close()
	v.hook(again)
	v.bound = answered
	v.timeouts.Store(escapeAfter - 1)
	slots, err := again.ClusterSlots(ctx).Result() //lint:ignore SA1019 the read go-redis makes of its slot map
	require.NoError(t, err)
	assert.Len(t, slots, 3)
	assert.Zero(t, v.timeouts.Load(), "a read that answered resets the count")
}

// TestClusterViewRoute: a call the cluster client would send to a node
// that is not a master of the last map read is refused before it is sent,
// with a stale-map error; before the first read nothing is refused.
func TestClusterViewRoute(t *testing.T) {
	t.Parallel()
	cl := testenv.SharedRedisCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cc := cl.NewClient(nil)
	v := &clusterView{cc: cc, bound: slotReadBound, hooked: map[*redis.Client]bool{}}
	require.NoError(t, v.route(ctx, "{a}"), "nothing read yet: nothing refused")
	v.read(ctx, true)
	require.NoError(t, v.route(ctx, "{a}"))
	node, err := cc.MasterForKey(ctx, "{a}")
	require.NoError(t, err)
	// The map as if the master of {a} had not been a master when read.
	others := map[string]bool{}
	for addr := range *v.masters.Load() {
		if addr != node.Options().Addr {
			others[addr] = true
		}
	}
	v.masters.Store(&others)
	err = v.route(ctx, "{a}")
	var unmapped *unmappedSlotError
	require.True(t, errors.As(err, &unmapped), "got %v", err)
	assert.True(t, staleTopology(err), "a stale-map error: waits and renewals retry it after a reload")
	assert.Equal(t, "fence: the cluster client's slot map has no master for {a} (it would go to "+node.Options().Addr+", not a master); the map is read again", err.Error())
	assert.Len(t, v.hooked, 6, "read hooks the masters and the replicas")
}
