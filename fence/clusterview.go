package fence

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Locks. clusterView.mu guards the node clients given the hook and the
// reload in progress; it is the first in the package's order (see
// client.go): refresh starts its reload with Client.mu taken under it
// (goBackground), and nothing takes it under another mutex: go-redis
// calls hook when it makes a node client, and fence never asks it for
// one while holding a mutex.

// A stopped node (SIGSTOP, a frozen VM) accepts connections and never
// answers, and go-redis waits for it as long as the node's ReadTimeout in
// two places that are not the stopped node's own business:
//
//   - It reads its slot map (CLUSTER SLOTS) from one node at a time, in
//     random order over every node it knows, replicas included. A reload
//     that picks a stopped replica first keeps the map stale for that
//     long, and meanwhile the calls for the slots of a master that failed
//     over go to the dead address: a stopped replica of one master costs
//     the locks of another.
//   - A slot its map has no master for (a map read while a master was
//     failed) goes to a random node, replicas included: a renewal sent to
//     a stopped replica hangs until the lock is lost.
//
// clusterView keeps fence clear of both. It bounds every slot-map read
// (and the COMMAND table read of clients that route by it) on each node
// client of the cluster client, with a hook that pipelines pass through
// untouched: a read that does not answer within slotReadBound is given up
// (it goes on in the background until ReadTimeout ends it) and go-redis
// moves to the next node. And it knows the masters of the last map it
// read, so that fence sends no call to a node that is not one: such a
// call fails at once with an *unmappedSlotError, a stale-map error that
// waits and renewals retry after the map is read again.
//
// A bound too short for a slow network would fail every read and leave
// the map stale for good: after escapeAfter bounded reads in a row timed
// out, the next one waits as long as the node allows.
//
// Node clients come from go-redis: those made after New get the hook from
// OnNewNode, those in the map at New or at a later reload from that
// reload. A node client made before New that was in no map since (a seed
// that is not a node of the cluster) has none; it is read only while its
// address is among the seeds go-redis still tries.
type clusterView struct {
	c        *Client
	cc       *redis.ClusterClient
	bound    time.Duration
	timeouts atomic.Int32                    // bounded reads in a row that timed out
	masters  atomic.Pointer[map[string]bool] // addresses of the masters of the last map read; nil: not read yet

	mu         sync.Mutex
	hooked     map[*redis.Client]bool // the node clients given the hook
	refreshing bool                   // a reload runs (refresh)
	again      bool                   // another was asked for meanwhile
}

// slotReadBound bounds one slot-map read of one node: a node answers in
// well under a millisecond on a LAN and in tens across regions, and a
// read given up on a slow one costs only the next node's read.
const slotReadBound = 500 * time.Millisecond

// escapeAfter is how many bounded reads in a row may time out before one
// read is let wait for the node's own timeout.
const escapeAfter = 6

// refreshEvery spaces the slot-map reloads fence asks for.
const refreshEvery = 200 * time.Millisecond

// newClusterView hooks the node clients cc makes from now on; read (in
// the client's background checks) does the others.
func newClusterView(c *Client, cc *redis.ClusterClient) *clusterView {
	v := &clusterView{c: c, cc: cc, bound: slotReadBound, hooked: map[*redis.Client]bool{}}
	cc.OnNewNode(v.hook)
	return v
}

// read reloads the slot map, hooks its masters and records them; with
// replicas, it reloads once more to hook the replicas too (go-redis says
// which node is which only that way): at New, and when the masters
// changed (a failover), so that a refresh costs one round trip.
func (v *clusterView) read(ctx context.Context, replicas bool) {
	var mu sync.Mutex
	masters := map[string]bool{}
	err := v.cc.ForEachMaster(ctx, func(_ context.Context, node *redis.Client) error {
		v.hook(node)
		mu.Lock()
		masters[node.Options().Addr] = true
		mu.Unlock()
		return nil
	})
	if err == nil {
		if old := v.masters.Swap(&masters); old != nil && !maps.Equal(*old, masters) {
			replicas = true
		}
	}
	if replicas {
		_ = v.cc.ForEachSlave(ctx, func(_ context.Context, node *redis.Client) error {
			v.hook(node)
			return nil
		})
	}
}

// refresh reads the map again in the background: one read at a time,
// another after it when one was asked for meanwhile, refreshEvery apart.
func (v *clusterView) refresh() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.refreshing {
		v.again = true
		return
	}
	v.refreshing = true
	if !v.c.goBackground(v.refreshLoop) {
		v.refreshing = false // closed
	}
}

func (v *clusterView) refreshLoop() {
	bg := v.c.bgCtx
	for {
		ctx, cancel := context.WithTimeout(bg, checkTimeout)
		v.read(ctx, false)
		cancel()
		t := time.NewTimer(refreshEvery)
		select {
		case <-t.C:
		case <-bg.Done():
			t.Stop()
		}
		v.mu.Lock()
		if !v.again || bg.Err() != nil {
			v.refreshing, v.again = false, false
			v.mu.Unlock()
			return
		}
		v.again = false
		v.mu.Unlock()
	}
}

// route is the error of a call for key when the cluster client would send
// it to a node that is not a master of the last map read (a slot its own
// map has no master for goes to a random node); nil otherwise, and before
// the first read.
func (v *clusterView) route(ctx context.Context, key string) error {
	masters := v.masters.Load()
	if masters == nil {
		return nil
	}
	node, err := v.cc.MasterForKey(ctx, key)
	if err != nil || (*masters)[node.Options().Addr] {
		return nil // the pipeline reports its own error
	}
	return &unmappedSlotError{key: key, node: node.Options().Addr}
}

// unmappedSlotError fails a call the cluster client would have sent to a
// node that is not a master (clusterView.route): a stale-map error
// (staleTopology), retried after the map is read again.
type unmappedSlotError struct{ key, node string }

func (e *unmappedSlotError) Error() string {
	return fmt.Sprintf("fence: the cluster client's slot map has no master for %s (it would go to %s, not a master); the map is read again", e.key, e.node)
}

// hook adds the bound to node, once; a node whose own ReadTimeout is
// shorter than the bound needs none.
func (v *clusterView) hook(node *redis.Client) {
	if rt := node.Options().ReadTimeout; rt > 0 && rt <= v.bound {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.hooked[node] {
		return
	}
	v.hooked[node] = true
	node.AddHook(slotReadHook{v})
}

// slotReadHook bounds a node client's reads of the cluster's layout.
type slotReadHook struct{ v *clusterView }

func (slotReadHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (slotReadHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h slotReadHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		clone, copyBack := layoutRead(ctx, cmd)
		if clone == nil {
			return next(ctx, cmd)
		}
		return h.v.bounded(ctx, next, cmd, clone, copyBack)
	}
}

// bounded runs clone in a goroutine and gives cmd its answer, or a
// timeout after the bound (go-redis sets the returned error on cmd). The
// goroutine owns clone alone, so a read that answers after the bound
// writes nothing that cmd's caller reads.
func (v *clusterView) bounded(ctx context.Context, next redis.ProcessHook, cmd, clone redis.Cmder, copyBack func()) error {
	if v.timeouts.Load() >= escapeAfter {
		v.timeouts.Store(0)
		return next(ctx, cmd)
	}
	done := make(chan error, 1)
	go func() { done <- next(ctx, clone) }()
	t := time.NewTimer(v.bound)
	defer t.Stop()
	select {
	case err := <-done:
		// next's error is the answer: go-redis sets it on the command
		// only above the hooks (Client.Process).
		v.timeouts.Store(0)
		copyBack()
		return err
	case <-t.C:
		v.timeouts.Add(1)
		return &layoutReadTimeout{cmd: commandLine(cmd.Args()), bound: v.bound}
	}
}

// layoutRead returns a fresh copy of cmd, and the function that copies
// the copy's answer into cmd, when cmd reads the cluster's layout
// (CLUSTER SLOTS, CLUSTER SHARDS, COMMAND); nil otherwise.
func layoutRead(ctx context.Context, cmd redis.Cmder) (redis.Cmder, func()) {
	switch c := cmd.(type) {
	case *redis.ClusterSlotsCmd:
		clone := redis.NewClusterSlotsCmd(ctx, c.Args()...)
		return clone, func() { c.SetVal(clone.Val()) }
	case *redis.ClusterShardsCmd:
		clone := redis.NewClusterShardsCmd(ctx, c.Args()...)
		return clone, func() { c.SetVal(clone.Val()) }
	case *redis.CommandsInfoCmd:
		clone := redis.NewCommandsInfoCmd(ctx, c.Args()...)
		return clone, func() { c.SetVal(clone.Val()) }
	}
	return nil, nil
}

// layoutReadTimeout is the error of a layout read given up at the bound:
// a net.Error that timed out, as the node's own read timeout would be.
type layoutReadTimeout struct {
	cmd   string
	bound time.Duration
}

func (e *layoutReadTimeout) Error() string {
	return fmt.Sprintf("fence: %s got no answer within %v (the node may be stopped); another node is asked", e.cmd, e.bound)
}

// commandLine is a command's name and arguments, as an operator types them.
func commandLine(args []any) string {
	parts := make([]string, len(args))
	for i, a := range args {
		parts[i] = strings.ToUpper(fmt.Sprint(a))
	}
	return strings.Join(parts, " ")
}
func (e *layoutReadTimeout) Timeout() bool   { return true }
func (e *layoutReadTimeout) Temporary() bool { return true }
