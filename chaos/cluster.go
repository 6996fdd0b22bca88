package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/fencelock/fencelock/testenv"
)

// Fault kinds of a cluster run ([Config.Cluster]). Each hits one master:
// the one serving a resource held when the fault begins. Every trial has one
// resource per master, so the others show what the fault costs elsewhere.
const (
	// FaultClusterKill SIGKILLs the master; the cluster promotes its
	// replica (automatic failover after the node timeout).
	FaultClusterKill = "cluster-kill-master"
	// FaultClusterStall SIGSTOPs the master beyond the lease but within
	// the node timeout (no failover), then SIGCONTs it.
	FaultClusterStall = "cluster-stall-master"
	// FaultClusterLossy makes the replica miss the master's writes
	// (testenv MissWrites) until a lock was acquired on the master, then
	// kills the master and promotes the replica at once (CLUSTER FAILOVER
	// TAKEOVER): the replica lacks that lock and its counter. The holders
	// on that master cannot reach the promoted replica for one lease (they
	// were on the dead master's side of a partition), so they believe they
	// hold the lock until their local deadline while others take it: the
	// window in which only the database can refuse the old holder.
	FaultClusterLossy = "cluster-lossy-failover"
	// FaultClusterCut cuts every worker's connections to the master
	// (refused) beyond the lease; the cluster itself still sees the node.
	FaultClusterCut = "cluster-cut-node"
	// FaultClusterReplicaStall SIGSTOPs a replica of another master beyond
	// the lease, and meanwhile moves the master's slots to its replica
	// (CLUSTER FAILOVER TAKEOVER) and kills the demoted node, so that every
	// worker must read the slot map again while a node of the cluster
	// never answers: the stopped replica may cost the moved master's locks
	// their renewals for the failover's length, and no lock elsewhere.
	FaultClusterReplicaStall = "cluster-stall-replica"
)

// ClusterFaultKinds lists the fault kinds of a cluster run, in report order.
var ClusterFaultKinds = []string{FaultClusterKill, FaultClusterStall, FaultClusterLossy, FaultClusterCut, FaultClusterReplicaStall}

const (
	// clusterLease is a cluster run's default lease: long enough that a
	// renewal period (lease/3) is several round trips through the proxies
	// on a loaded machine, short enough that a stall beyond it stays within
	// the node timeout.
	clusterLease = time.Second
	// clusterControlLease is the lease of the guard-off cluster control:
	// renewals 2 s apart leave the old holder believing for up to 2 s after
	// the replica took over without its lock, while a waiter takes the lock
	// on the replica within about half a second. (With the 1 s lease the
	// old holder mostly learns first: the window is one renewal period.)
	clusterControlLease = 6 * time.Second
	// clusterNodeTimeout is the cluster's node timeout: above the longest
	// stall (1.6 leases), so a stall is not a failover.
	clusterNodeTimeout = 2500 * time.Millisecond
)

func startCluster(ctx context.Context, partialCoverage bool) (*testenv.Cluster, error) {
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return testenv.StartRedisCluster(cctx, testenv.WithNodeTimeout(clusterNodeTimeout),
		testenv.WithRequireFullCoverage(!partialCoverage))
}

// nodeProxies starts one worker's proxies, one in front of every node.
func nodeProxies(c *testenv.Cluster) (map[string]*testenv.Proxy, error) {
	out := map[string]*testenv.Proxy{}
	for _, nd := range c.Nodes {
		p, err := testenv.NewProxy(nd.Addr)
		if err != nil {
			for _, q := range out {
				_ = q.Close()
			}
			return nil, err
		}
		out[nd.Addr] = p
	}
	return out, nil
}

// prepareCluster brings the cluster back to health (the last trial's victim
// restarted or resumed, every replica in sync) and returns one resource name
// per master.
func (t *trial) prepareCluster(ctx context.Context) ([]string, error) {
	c := t.env.cluster
	for _, nd := range c.Nodes {
		if nd.PID() == 0 {
			// Without its data, as a crashed node without persistence: it
			// rejoins as the replica of the node that replaced it.
			if err := nd.Restart(false); err != nil {
				return nil, fmt.Errorf("chaos: restart cluster node %s: %w", nd.Addr, err)
			}
		} else {
			_ = nd.Resume() // in case a fault left it stopped
		}
	}
	hctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := c.WaitHealthy(hctx); err != nil {
		return nil, err
	}
	masters, err := c.Masters(hctx)
	if err != nil {
		return nil, err
	}
	byMaster := map[*testenv.ClusterNode]string{}
	var out []string
	for k := 0; len(out) < len(masters) && k < 1000; k++ {
		name := fmt.Sprintf("t%d-r%d", t.n, k)
		m, err := c.MasterFor(hctx, "{"+name+"}") // the lock's slot is its name's
		if err != nil {
			return nil, err
		}
		if _, ok := byMaster[m]; !ok {
			byMaster[m] = name
			out = append(out, name)
		}
	}
	if len(out) < len(masters) {
		return nil, errors.New("chaos: found no resource name for every master")
	}
	return out, nil
}

// injectCluster runs one cluster fault (f.Kind) and heals what can be
// healed at once; a killed master is restarted before the next trial.
func (t *trial) injectCluster(ctx context.Context, f *Fault, rng *rand.Rand) error {
	c := t.env.cluster
	L := t.cfg.Lease
	scale := func(lo, hi float64) time.Duration {
		return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(L))
	}
	now := func() int64 { return time.Now().UnixNano() }
	if len(f.Held) == 0 {
		// A fault that meets a holder says more (loss detection): wait a
		// little for one.
		end := time.Now().Add(2 * L)
		for ctx.Err() == nil && time.Now().Before(end) && len(f.Held) == 0 {
			time.Sleep(5 * time.Millisecond)
			f.Held = holders(t.rec.Events())
		}
	}
	res := t.resources[rng.IntN(len(t.resources))]
	if len(f.Held) > 0 {
		res = f.Held[rng.IntN(len(f.Held))].Resource
	}
	m, err := c.MasterFor(ctx, "{"+res+"}")
	if err != nil {
		return err
	}
	f.Node, f.Resources = m.Addr, []string{res}
	fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	switch f.Kind {
	case FaultClusterKill:
		f.At = now()
		if err := m.Kill(); err != nil {
			return err
		}
		if _, err := c.WaitFailover(fctx, m); err != nil {
			return err
		}
		f.HealAt = now()
		f.Param = time.Duration(f.HealAt - f.At) // the failover's length
	case FaultClusterStall:
		f.Param = scale(1.2, 1.6)
		f.At = now()
		if err := m.Pause(); err != nil {
			return err
		}
		sleepCtx(ctx, f.Param)
		err := m.Resume()
		f.HealAt = now()
		return err
	case FaultClusterCut:
		f.Param = scale(1.5, 2.5)
		procs := t.alive()
		f.At = now()
		for _, p := range procs {
			p.nodeProxy[m.Addr].Cut()
		}
		sleepCtx(ctx, f.Param)
		for _, p := range procs {
			p.nodeProxy[m.Addr].Restore()
		}
		f.HealAt = now()
	case FaultClusterLossy:
		reps, err := m.Replicas(fctx)
		if err != nil {
			return err
		}
		if len(reps) == 0 {
			return fmt.Errorf("master %s has no replica", m.Addr)
		}
		r := reps[0]
		from := now()
		if err := r.MissWrites(fctx, m.Redis); err != nil {
			return err
		}
		// Writes the replica misses: an acquisition on the master's
		// resource (its lock and token counter), and a little work under it.
		t.waitAcquire(ctx, res, from, time.Unix(0, from).Add(3*L))
		sleepCtx(ctx, clusterLease/4)
		f.Held = holders(t.rec.Events())
		// The holders on the dying master stay on its side of the
		// partition: they cannot reach the promoted replica for a lease,
		// so they learn of the loss only at their local deadline, while
		// everyone else already takes the lock there.
		var cut []*testenv.Proxy
		for _, h := range f.affected() {
			for _, p := range t.alive() {
				if p.id == h.Worker {
					cut = append(cut, p.nodeProxy[r.Addr])
				}
			}
		}
		f.At = now()
		for _, p := range cut {
			p.Cut()
		}
		if err := m.Kill(); err != nil {
			return err
		}
		if err := r.Resume(); err != nil {
			return err
		}
		if err := r.Failover(fctx, testenv.FailoverTakeover); err != nil {
			return err
		}
		f.Param = time.Duration(now() - f.At) // the failover's length
		sleepCtx(ctx, time.Until(time.Unix(0, f.At).Add(L)))
		for _, p := range cut {
			p.Restore()
		}
		f.HealAt = now()
	case FaultClusterReplicaStall:
		return t.stallReplicaDuringFailover(ctx, fctx, f, m, scale(1.5, 2.5))
	default:
		return fmt.Errorf("unknown cluster fault kind %q", f.Kind)
	}
	return nil
}

// stallReplicaDuringFailover is FaultClusterReplicaStall: a replica of
// another master than m is stopped for d; meanwhile m's replica takes its
// slots over and the demoted m is killed (restarted before the next
// trial), so that calls for its slots are refused until a worker's slot
// map is read again. f.Node is the stopped replica, f.Param the stall.
func (t *trial) stallReplicaDuringFailover(ctx, fctx context.Context, f *Fault, m *testenv.ClusterNode, d time.Duration) error {
	c := t.env.cluster
	masters, err := c.Masters(fctx)
	if err != nil {
		return err
	}
	var stopped, heir *testenv.ClusterNode
	for _, o := range masters {
		reps, err := o.Replicas(fctx)
		if err != nil {
			return err
		}
		if len(reps) == 0 {
			return fmt.Errorf("master %s has no replica", o.Addr)
		}
		if o == m {
			heir = reps[0]
		} else if stopped == nil {
			stopped = reps[0]
		}
	}
	if stopped == nil || heir == nil {
		return errors.New("chaos: no replica of another master to stop")
	}
	f.Node, f.Param = stopped.Addr, d
	f.At = time.Now().UnixNano()
	if err := stopped.Pause(); err != nil {
		return err
	}
	err = heir.Failover(fctx, testenv.FailoverTakeover)
	if err == nil {
		err = m.Kill()
	}
	sleepCtx(ctx, time.Until(time.Unix(0, f.At).Add(d)))
	if rerr := stopped.Resume(); err == nil {
		err = rerr
	}
	f.HealAt = time.Now().UnixNano()
	return err
}

// waitAcquire waits until some worker acquired res after from, or until
// the deadline.
func (t *trial) waitAcquire(ctx context.Context, res string, from int64, deadline time.Time) {
	for ctx.Err() == nil && time.Now().Before(deadline) {
		for _, e := range t.rec.Events() {
			if e.Type == evAcquire && e.Resource == res && e.At > from {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lostElsewhere counts the locks lost, between a cluster fault and one
// lease after it healed, on resources the fault did not touch (other
// masters'): what one master's trouble cost the others. With
// cluster-require-full-coverage yes (the Redis default) every master answers
// CLUSTERDOWN from the moment the dead one is failed until its replica is
// promoted, so short leases on healthy masters can be lost too.
func lostElsewhere(f Fault, events []Event, lease time.Duration) int {
	if f.Node == "" || f.At == 0 {
		return 0
	}
	end := f.HealAt + int64(lease)
	n := 0
	for _, e := range events {
		if e.Type == evLost && !contains(f.Resources, e.Resource) && e.At >= f.At && e.At <= end {
			n++
		}
	}
	return n
}
