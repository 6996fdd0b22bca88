package testenv

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterOption configures a Redis Cluster started by testenv.
type ClusterOption interface {
	apply(*clusterConfig) error
}

type clusterConfig struct {
	masters      int
	replicas     int
	nodeTimeout  time.Duration
	fullCoverage bool
	args         []string
}

// WithMasters sets the number of masters (default 3; at least 1). Automatic
// failover needs a majority of masters alive to vote, so 3 is the least
// that survives the loss of one.
func WithMasters(n int) ClusterOption {
	return optionFunc[clusterConfig](func(c *clusterConfig) error { c.masters = n; return nil })
}

// WithReplicas sets the number of replicas per master (default 1).
func WithReplicas(m int) ClusterOption {
	return optionFunc[clusterConfig](func(c *clusterConfig) error { c.replicas = m; return nil })
}

// WithNodeTimeout sets cluster-node-timeout (default 1 s): how long a node
// may not answer before it is failed and its replica promoted. Production
// default is 15 s; a short one keeps failover tests to seconds.
func WithNodeTimeout(d time.Duration) ClusterOption {
	return optionFunc[clusterConfig](func(c *clusterConfig) error { c.nodeTimeout = d; return nil })
}

// WithRequireFullCoverage sets cluster-require-full-coverage (default yes,
// as Redis): with no, the cluster keeps serving the slots it still has when
// a master is lost with no replica to promote.
func WithRequireFullCoverage(on bool) ClusterOption {
	return optionFunc[clusterConfig](func(c *clusterConfig) error { c.fullCoverage = on; return nil })
}

// WithClusterNodeArgs passes extra redis-server arguments to every node.
func WithClusterNodeArgs(args ...string) ClusterOption {
	return optionFunc[clusterConfig](func(c *clusterConfig) error { c.args = append(c.args, args...); return nil })
}

// FailoverMode is the variant of CLUSTER FAILOVER that [ClusterNode.Failover]
// sends.
type FailoverMode string

const (
	// FailoverGraceful waits for the master to hand over: no write is
	// lost, and the master must be reachable.
	FailoverGraceful FailoverMode = ""
	// FailoverForce skips the master (it may be dead or paused) but still
	// needs a majority of masters to vote.
	FailoverForce FailoverMode = "FORCE"
	// FailoverTakeover needs no one: the replica bumps the epoch and takes
	// the slots, as an operator does when most masters are gone.
	FailoverTakeover FailoverMode = "TAKEOVER"
)

// Cluster is a Redis Cluster started by testenv: masters with their
// replicas, every node a real redis-server in cluster mode on 127.0.0.1.
type Cluster struct {
	// Nodes are the servers: the masters at start first, then their
	// replicas (replicas of master i follow in order). Roles change with
	// failovers; ask [Cluster.Masters] or [Cluster.MasterFor] for today's.
	Nodes []*ClusterNode

	cfg clusterConfig

	mu        sync.Mutex
	replicaOf map[string]string // node ID -> master ID at the last healthy check
	clients   []*redis.ClusterClient
	client    *redis.ClusterClient
}

// ClusterNode is one server of a Cluster. The embedded [Redis] carries the
// process faults (Pause, Resume, Kill, Restart, Flush, MissWrites); a
// restarted node keeps its ID and its place in the cluster (nodes.conf).
type ClusterNode struct {
	*Redis
	// ID is the node's cluster ID.
	ID string

	cluster *Cluster
}

// StartRedisCluster starts a cluster (default 3 masters, 1 replica each,
// node timeout 1 s) and returns once every slot is served, every node
// agrees on the topology and every replica is in sync. The caller must call
// Stop.
func StartRedisCluster(ctx context.Context, opts ...ClusterOption) (*Cluster, error) {
	cfg := clusterConfig{masters: 3, replicas: 1, nodeTimeout: time.Second, fullCoverage: true}
	if err := applyOptions(&cfg, opts); err != nil {
		return nil, err
	}
	if cfg.masters < 1 || cfg.replicas < 0 {
		return nil, fmt.Errorf("testenv: cluster of %d masters with %d replicas each: want at least 1 master and no negative replica count", cfg.masters, cfg.replicas)
	}
	if cfg.nodeTimeout < 100*time.Millisecond {
		return nil, fmt.Errorf("testenv: cluster node timeout %v: want at least 100ms", cfg.nodeTimeout)
	}
	// A fresh node can be met by a node of another cluster before ours
	// meets it: a surviving node of a cluster whose member was killed keeps
	// handshaking with the dead member's address, and the kernel may have
	// given that port to one of our nodes. Such a node then knows a
	// stranger (CLUSTER ADDSLOTSRANGE refuses: "Slot 0 is already busy";
	// CLUSTER SET-CONFIG-EPOCH refuses: "knows other node" or "epoch is
	// already non-zero"; or the cluster never agrees). That attempt is
	// thrown away and the cluster started again on new ports.
	var errs []error
	for attempt := 1; attempt <= clusterStartAttempts; attempt++ {
		c := &Cluster{cfg: cfg, replicaOf: map[string]string{}}
		err := c.start(ctx)
		if err == nil {
			return c, nil
		}
		_ = c.Stop()
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
		if !errors.Is(err, errStrangerNode) || ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// clusterStartAttempts bounds how often a cluster start is retried after a
// node of another cluster met one of ours.
const clusterStartAttempts = 4

// errStrangerNode marks a start attempt spoiled by a node of another
// cluster (see StartRedisCluster).
var errStrangerNode = errors.New("testenv: a node of another cluster met a new cluster node; start again on new ports")

// NewRedisCluster starts a private cluster for the test (faults allowed),
// stopped at the end of the test. A cluster that cannot be started fails the
// test with the reason.
func NewRedisCluster(t testing.TB, opts ...ClusterOption) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := StartRedisCluster(ctx, opts...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

var sharedCluster *Cluster

// SharedRedisCluster returns the 3-master, 1-replica cluster shared by the
// whole test binary, started on first use and stopped by StopShared (Main
// calls it). Tests must not inject faults into it; they use unique keys.
// Its node timeout is 5 s, so a loaded machine does not fail a node over.
func SharedRedisCluster(t testing.TB) *Cluster {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedCluster == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c, err := StartRedisCluster(ctx, WithNodeTimeout(5*time.Second))
		if err != nil {
			t.Fatalf("%v", err)
		}
		sharedCluster = c
	}
	return sharedCluster
}

func stopSharedCluster() {
	sharedMu.Lock()
	c := sharedCluster
	sharedCluster = nil
	sharedMu.Unlock()
	if c != nil {
		_ = c.Stop()
	}
}

func (c *Cluster) nodeArgs() []string {
	cov := "no"
	if c.cfg.fullCoverage {
		cov = "yes"
	}
	args := []string{
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(c.cfg.nodeTimeout.Milliseconds(), 10),
		"--cluster-require-full-coverage", cov,
		// A replica whose link has been down for long (MissWrites) is
		// still promoted: the data loss is what such tests are after.
		"--cluster-replica-validity-factor", "0",
		// Replicas stay with the master they were given.
		"--cluster-allow-replica-migration", "no",
		// Full syncs start at once instead of after 5 s.
		"--repl-diskless-sync-delay", "0",
	}
	return append(args, c.cfg.args...)
}

func (c *Cluster) start(ctx context.Context) error {
	if err := c.startNodes(ctx); err != nil {
		return err
	}
	if err := c.assignSlots(ctx); err != nil {
		return err
	}
	if err := c.meet(ctx); err != nil {
		return err
	}
	if err := c.replicate(ctx); err != nil {
		return err
	}
	if err := c.moveOffsets(ctx); err != nil {
		return err
	}
	return c.WaitHealthy(ctx)
}

// startNodes starts every node, in parallel, and reads their ids.
func (c *Cluster) startNodes(ctx context.Context) error {
	n := c.cfg.masters * (1 + c.cfg.replicas)
	c.Nodes = make([]*ClusterNode, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := startRedis(redisConfig{args: c.nodeArgs(), clusterBus: true, dirPrefix: "fencelock-cluster-"}, nil)
			if err != nil {
				errs[i] = err
				return
			}
			c.Nodes[i] = &ClusterNode{Redis: r, cluster: c}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, nd := range c.Nodes {
		id, err := nd.adminClient().Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return fmt.Errorf("testenv: CLUSTER MYID on %s: %w", nd.Addr, err)
		}
		nd.ID = id
	}
	return nil
}

// assignSlots splits the slots evenly over the masters, each with its own
// config epoch (as redis-cli --cluster create does) so no epoch collision
// has to be resolved before the cluster is stable.
func (c *Cluster) assignSlots(ctx context.Context) error {
	per := 16384 / c.cfg.masters
	for i := 0; i < c.cfg.masters; i++ {
		nd := c.Nodes[i]
		lo, hi := i*per, (i+1)*per-1
		if i == c.cfg.masters-1 {
			hi = 16383
		}
		if err := nd.adminClient().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			if strings.Contains(err.Error(), "already busy") {
				// A fresh node serves no slot and knows of none: a slot
				// it calls busy was gossiped to it by a node of
				// another cluster.
				return fmt.Errorf("testenv: CLUSTER ADDSLOTSRANGE on %s: %w (%w)", nd.Addr, err, errStrangerNode)
			}
			return fmt.Errorf("testenv: CLUSTER ADDSLOTSRANGE on %s: %w", nd.Addr, err)
		}
		if err := nd.adminClient().Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			// Refused only when the node already knows another node or
			// bumped its epoch for one: nobody of ours has met it yet.
			return fmt.Errorf("testenv: CLUSTER SET-CONFIG-EPOCH on %s: %w (%w)", nd.Addr, err, errStrangerNode)
		}
	}
	return nil
}

// meet introduces every node to the first and waits until every node
// knows every other (a replica can follow only a master it knows); a node
// that knows one not of this cluster fails at once (errStrangerNode).
func (c *Cluster) meet(ctx context.Context) error {
	first := c.Nodes[0]
	for _, nd := range c.Nodes[1:] {
		if err := first.adminClient().Do(ctx, "CLUSTER", "MEET", "127.0.0.1", nd.port, nd.busPort).Err(); err != nil {
			return fmt.Errorf("testenv: CLUSTER MEET %s: %w", nd.Addr, err)
		}
	}
	ids := map[string]bool{}
	for _, nd := range c.Nodes {
		ids[nd.ID] = true
	}
	var met error
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	err := poll(pctx, "every cluster node to know every other", func() (bool, string) {
		for _, nd := range c.Nodes {
			v, err := nd.view(ctx)
			if err != nil {
				return false, err.Error()
			}
			if met = stranger(ids, nd, v); met != nil {
				cancel()
				return false, met.Error()
			}
			if why := v.unsettled(nd.Addr, len(c.Nodes)); why != "" {
				return false, why
			}
		}
		return true, ""
	})
	if met != nil {
		return met
	}
	return err
}

// stranger reports a node nd knows that is not one of ids.
func stranger(ids map[string]bool, nd *ClusterNode, v clusterView) error {
	for id, e := range v {
		if !ids[id] && !e.has("handshake") {
			return fmt.Errorf("%w: %s knows %s (%s)", errStrangerNode, nd.Addr, e.addr, id)
		}
	}
	return nil
}

// unsettled says why the view of the node at addr is not yet of all n
// nodes, each with an address and past its handshake; "" once it is.
func (v clusterView) unsettled(addr string, n int) string {
	if len(v) != n {
		return fmt.Sprintf("%s knows %d of %d nodes", addr, len(v), n)
	}
	for _, e := range v {
		if e.has("handshake") || e.has("noaddr") {
			return fmt.Sprintf("%s: %s is %s", addr, e.addr, e.flags)
		}
	}
	return ""
}

// replicate makes each replica follow its master.
func (c *Cluster) replicate(ctx context.Context) error {
	for r := 0; r < c.cfg.replicas; r++ {
		for i := 0; i < c.cfg.masters; i++ {
			nd := c.Nodes[c.cfg.masters+i*c.cfg.replicas+r]
			m := c.Nodes[i]
			if err := nd.adminClient().Do(ctx, "CLUSTER", "REPLICATE", m.ID).Err(); err != nil {
				return fmt.Errorf("testenv: CLUSTER REPLICATE %s on %s: %w", m.Addr, nd.Addr, err)
			}
			c.replicaOf[nd.ID] = m.ID
		}
	}
	return nil
}

// moveOffsets writes a key and deletes it on each master: Redis lists a
// replica in CLUSTER SLOTS only once its replication offset is not zero,
// which without a write takes the master's first replication ping (10 s);
// one write and its deletion, leaving no key, move every offset at once.
func (c *Cluster) moveOffsets(ctx context.Context) error {
	if c.cfg.replicas == 0 {
		return nil
	}
	for _, m := range c.Nodes[:c.cfg.masters] {
		// Written once the node serves its slots (CLUSTERDOWN before),
		// under a key of its slots (another answers MOVED).
		key, n := "", 0
		if err := poll(ctx, "a write on "+m.Addr, func() (bool, string) {
			key = "testenv:offset:" + strconv.Itoa(n)
			err := m.adminClient().Do(ctx, "SET", key, "1").Err()
			if _, moved := redis.IsMovedError(err); moved {
				n++
			}
			if err != nil {
				return false, err.Error()
			}
			return true, ""
		}); err != nil {
			return err
		}
		if err := m.adminClient().Do(ctx, "DEL", key).Err(); err != nil {
			return fmt.Errorf("testenv: DEL on %s: %w", m.Addr, err)
		}
	}
	return nil
}

// Addrs returns every node's address (seeds for a ClusterClient).
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, nd := range c.Nodes {
		addrs[i] = nd.Addr
	}
	return addrs
}

// Client returns a shared, ready ClusterClient with go-redis defaults (no
// ClusterStateReloadInterval: what a user who sets nothing gets); Stop
// closes it.
func (c *Cluster) Client() *redis.ClusterClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client == nil {
		c.client = c.newClientLocked(nil)
	}
	return c.client
}

// NewClient returns a new ClusterClient seeded with every node, closed by
// Stop. opts may be nil; its Addrs are overwritten.
func (c *Cluster) NewClient(opts *redis.ClusterOptions) *redis.ClusterClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.newClientLocked(opts)
}

func (c *Cluster) newClientLocked(opts *redis.ClusterOptions) *redis.ClusterClient {
	if opts == nil {
		opts = &redis.ClusterOptions{}
	}
	o := *opts
	o.Addrs = c.Addrs()
	cc := redis.NewClusterClient(&o)
	c.clients = append(c.clients, cc)
	return cc
}

// Stop closes the clients handed out and stops every node. It is safe to
// call more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	cs := c.clients
	c.clients, c.client = nil, nil
	c.mu.Unlock()
	for _, cc := range cs {
		_ = cc.Close()
	}
	var wg sync.WaitGroup
	for _, nd := range c.Nodes {
		if nd != nil {
			wg.Add(1)
			go func() { defer wg.Done(); _ = nd.Stop() }()
		}
	}
	wg.Wait()
	return nil
}

// Node returns the node with this address or cluster ID, or nil.
func (c *Cluster) Node(addrOrID string) *ClusterNode {
	for _, nd := range c.Nodes {
		if nd.Addr == addrOrID || nd.ID == addrOrID {
			return nd
		}
	}
	return nil
}

// PIDs returns the process IDs of the running nodes.
func (c *Cluster) PIDs() []int {
	var pids []int
	for _, nd := range c.Nodes {
		if pid := nd.PID(); pid != 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// viewEntry is one line of CLUSTER NODES.
type viewEntry struct {
	id, addr, flags, master string
	slots                   []string
}

func (e viewEntry) has(flag string) bool {
	for _, f := range strings.Split(e.flags, ",") {
		if f == flag {
			return true
		}
	}
	return false
}

type clusterView map[string]viewEntry // by node ID

// view is node nd's CLUSTER NODES.
func (nd *ClusterNode) view(ctx context.Context) (clusterView, error) {
	out, err := nd.adminClient().ClusterNodes(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("testenv: CLUSTER NODES on %s: %w", nd.Addr, err)
	}
	v := clusterView{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr := f[1]
		if i := strings.IndexAny(addr, "@,"); i >= 0 {
			addr = addr[:i]
		}
		v[f[0]] = viewEntry{id: f[0], addr: addr, flags: f[2], master: f[3], slots: f[8:]}
	}
	return v, nil
}

// agreed returns the view every running node holds (paused and dead nodes
// do not count), or an error saying who disagrees. Only roles and slots are
// compared; failure flags of nodes may lag between views.
func (c *Cluster) agreed(ctx context.Context) (clusterView, error) {
	var first clusterView
	var firstAddr, firstKey string
	for _, nd := range c.Nodes {
		if !nd.running() {
			continue
		}
		v, err := nd.view(ctx)
		if err != nil {
			return nil, err
		}
		key := v.shape()
		if first == nil {
			first, firstAddr, firstKey = v, nd.Addr, key
			continue
		}
		if key != firstKey {
			return nil, fmt.Errorf("testenv: %s and %s see different clusters:\n%s\n--\n%s", firstAddr, nd.Addr, firstKey, key)
		}
	}
	if first == nil {
		return nil, errors.New("testenv: no cluster node is running")
	}
	return first, nil
}

// shape is the view's roles and slots in a canonical form.
func (v clusterView) shape() string {
	var lines []string
	for _, e := range v {
		if e.has("master") {
			lines = append(lines, e.id+" master "+strings.Join(e.slots, " "))
		} else {
			lines = append(lines, e.id+" replica of "+e.master)
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// Masters returns the masters that serve slots, as all running nodes agree.
func (c *Cluster) Masters(ctx context.Context) ([]*ClusterNode, error) {
	v, err := c.agreed(ctx)
	if err != nil {
		return nil, err
	}
	var ms []*ClusterNode
	for _, nd := range c.Nodes {
		if e, ok := v[nd.ID]; ok && e.has("master") && len(e.slots) > 0 {
			ms = append(ms, nd)
		}
	}
	return ms, nil
}

// Replicas returns the nodes that replicate nd, as all running nodes agree.
func (nd *ClusterNode) Replicas(ctx context.Context) ([]*ClusterNode, error) {
	v, err := nd.cluster.agreed(ctx)
	if err != nil {
		return nil, err
	}
	var rs []*ClusterNode
	for _, o := range nd.cluster.Nodes {
		if e, ok := v[o.ID]; ok && !e.has("master") && e.master == nd.ID {
			rs = append(rs, o)
		}
	}
	return rs, nil
}

// MasterFor returns the master that serves key, as all running nodes agree.
func (c *Cluster) MasterFor(ctx context.Context, key string) (*ClusterNode, error) {
	var slot int64
	var err error
	for _, nd := range c.Nodes {
		if nd.running() {
			if slot, err = nd.adminClient().ClusterKeySlot(ctx, key).Result(); err == nil {
				break
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("testenv: CLUSTER KEYSLOT: %w", err)
	}
	return c.MasterForSlot(ctx, int(slot))
}

// MasterForSlot returns the master that serves slot, as all running nodes
// agree.
func (c *Cluster) MasterForSlot(ctx context.Context, slot int) (*ClusterNode, error) {
	v, err := c.agreed(ctx)
	if err != nil {
		return nil, err
	}
	for _, e := range v {
		if e.has("master") && slotsContain(e.slots, slot) {
			if nd := c.Node(e.id); nd != nil {
				return nd, nil
			}
		}
	}
	return nil, fmt.Errorf("testenv: no master serves slot %d", slot)
}

func slotsContain(ranges []string, slot int) bool {
	for _, r := range ranges {
		if strings.HasPrefix(r, "[") { // a slot being migrated
			continue
		}
		lo, hi, _ := strings.Cut(r, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			continue
		}
		b := a
		if hi != "" {
			if b, err = strconv.Atoi(hi); err != nil {
				continue
			}
		}
		if slot >= a && slot <= b {
			return true
		}
	}
	return false
}

// IsMaster reports whether nd serves slots as a master, as all running
// nodes agree.
func (nd *ClusterNode) IsMaster(ctx context.Context) (bool, error) {
	v, err := nd.cluster.agreed(ctx)
	if err != nil {
		return false, err
	}
	e := v[nd.ID]
	return e.has("master") && len(e.slots) > 0, nil
}

// WaitHealthy waits until every node runs, every node says cluster_state:ok
// and sees no node failed, all agree on roles and slots, and every replica
// is in sync with its master. Call it after restarting nodes to get back to
// a clean cluster.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	err := poll(ctx, "a healthy cluster", func() (bool, string) {
		for _, nd := range c.Nodes {
			if !nd.running() {
				return false, nd.Addr + " is not running (killed or paused)"
			}
			info, err := nd.adminClient().ClusterInfo(ctx).Result()
			if err != nil {
				return false, err.Error()
			}
			if s := infoField(info, "cluster_state"); s != "ok" {
				return false, nd.Addr + " cluster_state:" + s
			}
			v, err := nd.view(ctx)
			if err != nil {
				return false, err.Error()
			}
			for _, e := range v {
				if e.has("fail") || e.has("fail?") || e.has("handshake") {
					return false, fmt.Sprintf("%s sees %s as %s", nd.Addr, e.addr, e.flags)
				}
			}
		}
		v, err := c.agreed(ctx)
		if err != nil {
			return false, err.Error()
		}
		replicaOf := map[string]string{}
		for _, nd := range c.Nodes {
			e := v[nd.ID]
			if e.has("master") {
				continue
			}
			if !nd.replicaSynced(ctx) {
				return false, nd.Addr + " is not in sync with its master"
			}
			replicaOf[nd.ID] = e.master
		}
		// Redis leaves a replica out of CLUSTER SLOTS until the node that
		// answers has heard (by gossip) that it replicates: until then a
		// client's slot map lacks it, and its node client is made later.
		for _, nd := range c.Nodes {
			if missing := nd.slotsLackReplicas(ctx, len(replicaOf)); missing != "" {
				return false, missing
			}
		}
		c.mu.Lock()
		c.replicaOf = replicaOf
		c.mu.Unlock()
		return true, ""
	})
	return err
}

// slotsLackReplicas says how the node's CLUSTER SLOTS falls short of
// listing want replicas, "" when it lists them all.
func (nd *ClusterNode) slotsLackReplicas(ctx context.Context, want int) string {
	//lint:ignore SA1019 go-redis reads its slot map with CLUSTER SLOTS: what it lists is what clients see
	slots, err := nd.adminClient().ClusterSlots(ctx).Result()
	if err != nil {
		return err.Error()
	}
	got := 0
	for _, s := range slots {
		got += len(s.Nodes) - 1
	}
	if got < want {
		return fmt.Sprintf("CLUSTER SLOTS on %s lists %d of %d replicas", nd.Addr, got, want)
	}
	return ""
}

// Failover sends CLUSTER FAILOVER [FORCE|TAKEOVER] to replica nd and waits
// until every running node sees it as the master of its former master's
// slots.
func (nd *ClusterNode) Failover(ctx context.Context, mode FailoverMode) error {
	args := []any{"CLUSTER", "FAILOVER"}
	if mode != FailoverGraceful {
		args = append(args, string(mode))
	}
	if err := nd.adminClient().Do(ctx, args...).Err(); err != nil {
		return fmt.Errorf("testenv: CLUSTER FAILOVER %s on %s: %w", mode, nd.Addr, err)
	}
	return poll(ctx, nd.Addr+" to be master after CLUSTER FAILOVER "+string(mode), func() (bool, string) {
		ok, err := nd.IsMaster(ctx)
		if err != nil {
			return false, err.Error()
		}
		return ok, nd.Addr + " is not master yet"
	})
}

// WaitFailover waits until a node that replicated old (at the last healthy
// check) serves slots as master in the view of every running node, and
// returns it: the automatic failover after old was paused or killed for
// longer than the node timeout.
func (c *Cluster) WaitFailover(ctx context.Context, old *ClusterNode) (*ClusterNode, error) {
	c.mu.Lock()
	var cands []*ClusterNode
	for id, m := range c.replicaOf {
		if m == old.ID {
			cands = append(cands, c.Node(id))
		}
	}
	c.mu.Unlock()
	if len(cands) == 0 {
		return nil, fmt.Errorf("testenv: %s had no replica at the last healthy check: nothing can take over", old.Addr)
	}
	var got *ClusterNode
	err := poll(ctx, "a replica of "+old.Addr+" to be promoted", func() (bool, string) {
		v, err := c.agreed(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, nd := range cands {
			if e := v[nd.ID]; e.has("master") && len(e.slots) > 0 {
				got = nd
				return true, ""
			}
		}
		return false, "no replica of " + old.Addr + " is master yet"
	})
	return got, err
}
