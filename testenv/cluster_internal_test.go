package testenv

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A node of another cluster that meets one of a new cluster's fresh nodes
// before its slots are assigned (a survivor handshaking with a dead
// member's address, which the kernel gave to our node) gossips its slots
// to it: the assignment is refused ("Slot 0 is already busy"). That start
// attempt must be marked spoiled by a stranger, so that StartRedisCluster
// starts again on new ports, rather than fail the test that asked for a
// cluster (as one did under make flakes).
func TestClusterAssignSlotsMetByStranger(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	other, err := StartRedisCluster(ctx, WithMasters(1), WithReplicas(0))
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Stop() })

	c := &Cluster{cfg: clusterConfig{masters: 1, nodeTimeout: time.Second, fullCoverage: true}, replicaOf: map[string]string{}}
	require.NoError(t, c.startNodes(ctx))
	t.Cleanup(func() { _ = c.Stop() })
	fresh := c.Nodes[0]
	require.NoError(t, other.Nodes[0].adminClient().Do(ctx, "CLUSTER", "MEET", "127.0.0.1", fresh.port, fresh.busPort).Err())
	require.Eventually(t, func() bool {
		nodes, err := fresh.adminClient().Do(ctx, "CLUSTER", "NODES").Text()
		return err == nil && strings.Contains(nodes, "0-16383")
	}, 30*time.Second, 20*time.Millisecond, "the fresh node learns the other cluster's slots")

	err = c.assignSlots(ctx)
	require.Error(t, err)
	assert.True(t, errors.Is(err, errStrangerNode), "a slot gossiped by a stranger spoils the attempt, not the test: %v", err)
	assert.ErrorContains(t, err, "already busy")
}
