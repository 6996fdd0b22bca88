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

// TestClusterViewBoundTooShort: a bound that no node can meet (a slow
// network) must not leave the slot map stale for good. Each bounded read
// fails at once with a timeout that says what was given up; after
// escapeAfter of them in a row, the next read waits for the node.
func TestClusterViewBoundTooShort(t *testing.T) {
	cl := testenv.SharedRedisCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cc := cl.NewClient(nil)
	v := &clusterView{cc: cc, bound: slotReadBound, hooked: map[*redis.Client]bool{}}
	cc.OnNewNode(v.hook)
	node, err := cc.MasterForKey(ctx, "{a}") // loads the map within the bound
	require.NoError(t, err)
	require.True(t, v.hooked[node])

	v.bound = time.Nanosecond // no node answers this soon
	for i := range escapeAfter {
		err := node.ClusterSlots(ctx).Err() //lint:ignore SA1019 the read go-redis makes of its slot map
		var timeout *layoutReadTimeout
		require.True(t, errors.As(err, &timeout), "read %d fails with the bound's timeout, got %v", i, err)
		assert.Equal(t, "fence: CLUSTER SLOTS got no answer within 1ns (the node may be stopped); another node is asked", err.Error())
		assert.True(t, timeout.Timeout(), "a net.Error that timed out, as the node's own read timeout")
	}
	// The next read escapes the bound and gets the node's answer.
	slots, err := node.ClusterSlots(ctx).Result() //lint:ignore SA1019 the read go-redis makes of its slot map
	require.NoError(t, err)
	assert.Len(t, slots, 3)
	// And the count starts again: the read after is bounded.
	assert.Error(t, node.ClusterSlots(ctx).Err()) //lint:ignore SA1019 the read go-redis makes of its slot map
}

// TestClusterViewRoute: a call the cluster client would send to a node
// that is not a master of the last map read is refused before it is sent,
// with a stale-map error; before the first read nothing is refused.
func TestClusterViewRoute(t *testing.T) {
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
