package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/fence"
	"github.com/fencelock/fencelock/testenv"
)

// The cluster scenario: fence on a Redis Cluster of 3 masters with a
// replica each (testenv), pinned with the other servers. Contention is
// paired per repetition with fence on the single Redis; renewal counts
// round trips per node (go-redis hooks on every node client).

// clusterNodeTimeout is long: a loaded bench machine must not fail a node
// over in the middle of a measurement.
const clusterNodeTimeout = 10 * time.Second

func runCluster(ctx context.Context, e *env, res *results) error {
	s := res.scenario("cluster")
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	c, err := testenv.StartRedisCluster(cctx, testenv.WithMasters(3), testenv.WithReplicas(1), testenv.WithNodeTimeout(clusterNodeTimeout))
	cancel()
	if err != nil {
		return err
	}
	defer c.Stop()
	if res.Placement.Pinned {
		for _, pid := range c.PIDs() {
			if _, err := pinGroup(pid, 0); err != nil {
				return fmt.Errorf("pin cluster node: %w", err)
			}
		}
	}
	masters, err := c.Masters(ctx)
	if err != nil {
		return err
	}
	s.Notes = append(s.Notes,
		fmt.Sprintf("Redis Cluster of %d masters with 1 replica each (testenv, cluster-node-timeout %v), every node pinned with the other servers; fence.New on a *redis.ClusterClient (PoolSize %d, go-redis defaults otherwise).", len(masters), clusterNodeTimeout, poolSize),
		fmt.Sprintf("contended: %d goroutines on one name for %v, as the contended scenario, alternated per repetition with fence on the single Redis (row 'fence single'); server commands from INFO commandstats of the name's master.", e.cfg.ContendedWorkers, e.cfg.ContendedDur),
		fmt.Sprintf("renewal: N locks spread over the masters, lease %v (renewals every %v), %d periods measured after one settling period. Round trips per node: a go-redis hook on every node client. busy: union of the spans of fence's renewal pipelines on all nodes, per period. floor: one hand-written ClusterClient pipeline (go-redis splits it per node and sends the parts concurrently) replaying the latest renewal command captured per lock, median of 5.", e.cfg.RenewalLease, e.cfg.RenewalLease/3, e.cfg.RenewalPeriods))

	if err := clusterContended(ctx, e, c, s); err != nil {
		return fmt.Errorf("contended: %w", err)
	}
	if err := clusterRenewal(ctx, e, c, s, len(masters)); err != nil {
		return fmt.Errorf("renewal: %w", err)
	}
	return nil
}

// clusterLocker is fence on a ClusterClient, for the contended scenario's
// loop.
type clusterLocker struct {
	rdb *redis.ClusterClient
	c   *fence.Client
	cnt *counter // cluster-level hook: what fence asks of the client
}

func newClusterLocker(c *testenv.Cluster, opts ...fence.ClientOption) (*clusterLocker, error) {
	cnt := &counter{}
	rdb := c.NewClient(&redis.ClusterOptions{PoolSize: poolSize})
	rdb.AddHook(cnt)
	fc, err := fence.New(rdb, opts...)
	if err != nil {
		return nil, err
	}
	return &clusterLocker{rdb: rdb, c: fc, cnt: cnt}, nil
}

func (l *clusterLocker) Name() string      { return "fence cluster" }
func (l *clusterLocker) Counter() *counter { return l.cnt }
func (l *clusterLocker) Acquire(ctx context.Context, key string) (held, error) {
	lk, err := l.c.Acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return lk, nil
}
func (l *clusterLocker) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = l.c.Close(ctx)
	_ = l.rdb.Close()
}

func clusterContended(ctx context.Context, e *env, c *testenv.Cluster, s *scenario) error {
	cl, err := newClusterLocker(c)
	if err != nil {
		return err
	}
	defer cl.Close()
	// The contended loop reads INFO commandstats through env.ping: point a
	// copy of the env at the master that serves the name.
	m, err := c.MasterFor(ctx, "{contended}")
	if err != nil {
		return err
	}
	ce := *e
	ce.ping = m.NewClient(nil)
	defer ce.ping.Close()
	type agg struct{ acq, waitP99, minMax, cmds, gaps []float64 }
	a := map[string]*agg{"fence cluster": {}, "fence single": {}}
	for rep := 0; rep < e.cfg.Reps; rep++ {
		order := []string{"fence cluster", "fence single"}
		if rep%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, name := range order {
			var r *contendedRep
			if name == "fence cluster" {
				r, err = contendedOnce(ctx, &ce, cl)
			} else {
				r, err = contendedOnce(ctx, e, e.fence)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			g := a[name]
			g.acq = append(g.acq, r.acqPerS)
			g.waitP99 = append(g.waitP99, summarize(r.waits).P99/1e3)
			g.minMax = append(g.minMax, r.minMax)
			g.cmds = append(g.cmds, r.cmdsAcq)
			g.gaps = append(g.gaps, median(r.gaps))
			logf(e.log, "  cluster contended %s rep %d: %.0f acq/s, %.1f cmds/acq, per-goroutine %v", name, rep, r.acqPerS, r.cmdsAcq, r.perWorker)
			settle()
		}
	}
	for name, g := range a {
		s.set(name, "acq_per_s", newFigure("acquisitions/s", g.acq, nil))
		s.set(name, "wait_p99_ms", newFigure("ms", g.waitP99, nil))
		s.set(name, "min_max", newFigure("ratio", g.minMax, nil))
		s.set(name, "cmds_per_acq", newFigure("server commands/acquisition", g.cmds, nil))
		s.set(name, "gap_us", newFigure("µs", g.gaps, nil))
	}
	s.Ratios["contended acq_per_s cluster/single"] = pairedRatio(a["fence cluster"].acq, a["fence single"].acq)
	return nil
}

// nodeCounters hooks every node client of a ClusterClient.
type nodeCounters struct {
	mu sync.Mutex
	by map[string]*counter
}

func (nc *nodeCounters) attach(rdb *redis.ClusterClient) {
	rdb.OnNewNode(func(node *redis.Client) {
		cnt := &counter{}
		nc.mu.Lock()
		nc.by[node.Options().Addr] = cnt
		nc.mu.Unlock()
		node.AddHook(cnt)
	})
}

// renewedKeys is how many lock keys a renewal was captured for on all
// nodes since their startTiming.
func renewedKeys(nodes map[string]*counter) int {
	n := 0
	for _, cnt := range nodes {
		n += cnt.renewedKeys()
	}
	return n
}

func (nc *nodeCounters) all() map[string]*counter {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	out := make(map[string]*counter, len(nc.by))
	for k, v := range nc.by {
		out[k] = v
	}
	return out
}

func clusterRenewal(ctx context.Context, e *env, c *testenv.Cluster, s *scenario, nMasters int) error {
	type agg struct{ rtMax, rtMean, busy, floor, cpu, lost, renewed []float64 }
	a := map[int]*agg{}
	for _, n := range e.cfg.RenewalLocks {
		a[n] = &agg{}
	}
	for rep := 0; rep < e.cfg.RenewalReps; rep++ {
		for _, n := range e.cfg.RenewalLocks {
			r, err := clusterRenewalOnce(ctx, e, c, n)
			if err != nil {
				return fmt.Errorf("%d locks: %w", n, err)
			}
			g := a[n]
			g.rtMax = append(g.rtMax, r.rtMax)
			g.rtMean = append(g.rtMean, r.rtMean)
			g.busy = append(g.busy, r.busyMs)
			g.floor = append(g.floor, r.floorMs)
			g.cpu = append(g.cpu, r.cpuPct)
			g.lost = append(g.lost, float64(r.lost))
			g.renewed = append(g.renewed, r.renewed)
			logf(e.log, "  cluster renewal %d locks rep %d: round trips/node/period max %.2f mean %.2f (%s), busy %.2f ms, floor %.2f ms, cpu %.2f%%, %d lost",
				n, rep, r.rtMax, r.rtMean, r.perNode, r.busyMs, r.floorMs, r.cpuPct, r.lost)
		}
	}
	for _, n := range e.cfg.RenewalLocks {
		g := a[n]
		lib := fmt.Sprintf("fence %d locks", n)
		s.set(lib, "round_trips_per_node_period_max", newFigure("round trips", g.rtMax, nil))
		s.set(lib, "round_trips_per_node_period_mean", newFigure("round trips", g.rtMean, nil))
		s.set(lib, "renewed_per_period", newFigure("renewals", g.renewed, nil))
		s.set(lib, "busy_ms_per_period", newFigure("ms", g.busy, nil))
		s.set(lib, "cpu_pct_core", newFigure("% of one core", g.cpu, nil))
		s.set(lib, "locks_lost", newFigure("locks lost by the watchdog", g.lost, nil))
		s.set(fmt.Sprintf("floor pipeline %d", n), "busy_ms_per_period", newFigure("ms", g.floor, nil))
		s.Ratios[fmt.Sprintf("busy/floor %d", n)] = pairedRatio(g.busy, g.floor)
		// The goal's bound: one pipeline of up to renewBatchGoal renewals
		// per node, for the node's share of the locks.
		s.Extra[fmt.Sprintf("rt_per_node_limit_%d", n)] = math.Ceil(float64(n) / float64(nMasters) / renewBatchGoal)
	}
	return nil
}

type clusterRenewalRep struct {
	rtMax, rtMean, busyMs, floorMs, cpuPct, renewed float64
	perNode                                         string
	lost                                            int
}

func clusterRenewalOnce(ctx context.Context, e *env, c *testenv.Cluster, n int) (*clusterRenewalRep, error) {
	period := e.cfg.RenewalLease / 3
	nc := &nodeCounters{by: map[string]*counter{}}
	rdb := c.NewClient(&redis.ClusterOptions{PoolSize: poolSize})
	nc.attach(rdb)
	fc, err := fence.New(rdb, fence.WithLease(e.cfg.RenewalLease))
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = fc.Close(cctx)
		cancel()
		_ = rdb.Close()
	}()
	locks := make([]*fence.Lock, n)
	var wg sync.WaitGroup
	var errs errOnce
	for w := 0; w < setupWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += setupWorkers {
				l, err := fc.TryAcquire(ctx, fmt.Sprintf("cluster-renewal:%d:%d", n, i))
				if err != nil {
					errs.set(err)
					return
				}
				locks[i] = l
			}
		}(w)
	}
	wg.Wait()
	if err := errs.get(); err != nil {
		return nil, err
	}
	time.Sleep(period + period/4)

	nodes := nc.all()
	c0 := map[string]counts{}
	for addr, cnt := range nodes {
		c0[addr] = cnt.snapshot()
		cnt.startTiming()
	}
	cpu0 := cpuTime()
	t0 := time.Now()
	time.Sleep(time.Duration(e.cfg.RenewalPeriods) * period)
	// As in the single Redis's renewal: a loaded machine may run a round
	// a little after the window, so measure on until every lock was
	// renewed in it, within a lease (the floor replays each lock's
	// renewal). The figures are per period of the window.
	for renewedKeys(nodes) < n && time.Since(t0) < time.Duration(e.cfg.RenewalPeriods)*period+e.cfg.RenewalLease {
		time.Sleep(period / 8)
	}
	window := time.Since(t0)
	cpu1 := cpuTime()
	periods := window.Seconds() / period.Seconds()
	var spans []span
	var captured [][]any
	r := &clusterRenewalRep{cpuPct: 100 * (cpu1 - cpu0) / window.Seconds()}
	var per []string
	var sum float64
	for addr, cnt := range nodes {
		sp, capd := cnt.stopTiming()
		spans = append(spans, sp...)
		captured = append(captured, capd...)
		d := cnt.snapshot().sub(c0[addr])
		rt := float64(d.roundTrips) / periods
		if rt == 0 {
			continue // a replica: fence sends it nothing
		}
		per = append(per, fmt.Sprintf("%s %.2f", addr, rt))
		r.rtMax = math.Max(r.rtMax, rt)
		sum += rt
	}
	sort.Strings(per)
	r.perNode = strings.Join(per, ", ")
	if len(per) > 0 {
		r.rtMean = sum / float64(len(per))
	}
	r.busyMs = float64(unionLen(spans)) / float64(time.Millisecond) / periods
	for _, sp := range spans {
		r.renewed += float64(sp.cmds)
	}
	r.renewed /= periods

	live := make([]*fence.Lock, 0, n)
	for _, l := range locks {
		if l.Err() != nil {
			r.lost++
			continue
		}
		live = append(live, l)
	}
	floor, err := clusterFloor(ctx, rdb, captured, len(live))
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	r.floorMs = floor
	return r, nil
}

// clusterFloor replays the latest captured renewal per lock in one
// ClusterClient pipeline, five times, and returns the median in ms.
func clusterFloor(ctx context.Context, rdb *redis.ClusterClient, captured [][]any, live int) (float64, error) {
	byKey := map[string][]any{}
	for _, args := range captured {
		if len(args) < 4 {
			continue
		}
		if name, _ := args[0].(string); !strings.EqualFold(name, "evalsha") && !strings.EqualFold(name, "eval") {
			continue
		}
		byKey[fmt.Sprint(args[3])] = args
	}
	if len(byKey) < live {
		return 0, fmt.Errorf("captured renewals of %d keys, %d locks are held: the watchdog did not renew every lock during the measurement", len(byKey), live)
	}
	var runs []float64
	for try := 0; try < 5; try++ {
		pipe := rdb.Pipeline()
		cmds := make([]*redis.Cmd, 0, len(byKey))
		t := time.Now()
		for _, args := range byKey {
			cmds = append(cmds, pipe.Do(ctx, args...))
		}
		_, _ = pipe.Exec(ctx)
		d := time.Since(t)
		for _, cmd := range cmds {
			if err := cmd.Err(); err != nil {
				return 0, fmt.Errorf("replayed renewal %v: %w", cmd.Args(), err)
			}
		}
		runs = append(runs, float64(d)/float64(time.Millisecond))
	}
	return median(runs), nil
}
