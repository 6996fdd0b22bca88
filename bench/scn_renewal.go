package main

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/fence"
)

// setupWorkers acquire the locks of the renewal scenario concurrently.
const setupWorkers = 8

// renewBatchGoal is the batch size the renewal goal assumes: round trips
// per period <= ceil(locks/500).
const renewBatchGoal = 500

func runRenewal(ctx context.Context, e *env, res *results) error {
	s := res.scenario("renewal")
	s.Notes = append(s.Notes,
		fmt.Sprintf("fence client with WithLease(%v): renewals every %v. Per repetition: acquire N locks, let one period pass, then measure %d periods. Figures per renewal period.", e.cfg.RenewalLease, e.cfg.RenewalLease/3, e.cfg.RenewalPeriods),
		"round trips: go-redis hook on fence's client (one per command or pipeline). cmds: INFO commandstats delta (script-internal commands included). cpu: getrusage of the whole bench process (only fence's watchdog is active) as % of one core. heap/lock: HeapAlloc after GC with N locks held minus before, / N. goroutines: NumGoroutine with N held minus before.",
		"busy: time in a period during which a renewal pipeline of fence was in flight (union of the pipelines' spans, timed by the hook); round wall: first start to last end of a cluster of renewal pipelines (gaps < 20 ms). floor: one hand-written go-redis pipeline replaying, for every held lock, the renewal command (EVALSHA of fence's renew script with its keys and arguments) that the watchdog sent during the measurement, captured by the hook (median of 5 runs). peer loop: bsm/redislock lock.Refresh of N locks one after another (its documented refresh).")
	type agg struct {
		rt, cmds, cpuPct, cpuMs, heap, gor, busy, wall, renewed, floor, peer, lost []float64
		causes                                                                     []string
	}
	a := map[int]*agg{}
	for _, n := range e.cfg.RenewalLocks {
		a[n] = &agg{}
	}
	for rep := 0; rep < e.cfg.RenewalReps; rep++ {
		for _, n := range e.cfg.RenewalLocks {
			r, err := renewalOnce(ctx, e, n, e.cfg.RenewalLease)
			if err != nil {
				return fmt.Errorf("%d locks: %w", n, err)
			}
			g := a[n]
			g.rt = append(g.rt, r.rtPerPeriod)
			g.cmds = append(g.cmds, r.cmdsPerPeriod)
			g.cpuPct = append(g.cpuPct, r.cpuPct)
			g.cpuMs = append(g.cpuMs, r.cpuMsPerPeriod)
			g.heap = append(g.heap, r.heapPerLock)
			g.gor = append(g.gor, r.goroutines)
			g.busy = append(g.busy, r.busyMs)
			g.wall = append(g.wall, r.roundWallMs)
			g.renewed = append(g.renewed, r.renewedPerPeriod)
			g.floor = append(g.floor, r.floorMs)
			g.peer = append(g.peer, r.peerMs)
			g.lost = append(g.lost, float64(r.lost))
			if r.lostCause != "" {
				g.causes = append(g.causes, r.lostCause)
			}
			logf(e.log, "  renewal %d locks rep %d: %.1f rt/period, busy %.2f ms, wall %.2f ms, floor %.2f ms, peer %.1f ms, cpu %.2f%%, heap %.0f B/lock, %+.0f goroutines, %d lost %s",
				n, rep, r.rtPerPeriod, r.busyMs, r.roundWallMs, r.floorMs, r.peerMs, r.cpuPct, r.heapPerLock, r.goroutines, r.lost, r.lostCause)
		}
	}
	for _, n := range e.cfg.RenewalLocks {
		g := a[n]
		lib := fmt.Sprintf("fence %d locks", n)
		s.set(lib, "round_trips_per_period", newFigure("round trips", g.rt, nil))
		s.set(lib, "cmds_per_period", newFigure("server commands", g.cmds, nil))
		s.set(lib, "renewed_per_period", newFigure("renewals", g.renewed, nil))
		s.set(lib, "busy_ms_per_period", newFigure("ms", g.busy, nil))
		s.set(lib, "round_wall_ms", newFigure("ms", g.wall, nil))
		s.set(lib, "cpu_pct_core", newFigure("% of one core", g.cpuPct, nil))
		s.set(lib, "cpu_ms_per_period", newFigure("ms", g.cpuMs, nil))
		s.set(lib, "heap_bytes_per_lock", newFigure("bytes", g.heap, nil))
		s.set(lib, "goroutines_added", newFigure("goroutines", g.gor, nil))
		s.set(lib, "locks_lost", newFigure("locks lost by the watchdog", g.lost, nil))
		if len(g.causes) > 0 {
			s.Extra[fmt.Sprintf("lost_causes_%d", n)] = g.causes
		}
		s.set(fmt.Sprintf("floor pipeline %d", n), "busy_ms_per_period", newFigure("ms", g.floor, nil))
		s.set(fmt.Sprintf("redislock loop %d", n), "busy_ms_per_period", newFigure("ms", g.peer, nil))
		s.Ratios[fmt.Sprintf("busy/floor %d", n)] = pairedRatio(g.busy, g.floor)
		s.Ratios[fmt.Sprintf("peer_loop/busy %d", n)] = pairedRatio(g.peer, g.busy)
	}
	return renewalAtDefault(ctx, e, s)
}

// renewalAtDefault measures the renewal cost at fence's default lease
// (what an application that sets none pays), once: N locks, the same
// figures as above, per period and per second.
func renewalAtDefault(ctx context.Context, e *env, s *scenario) error {
	n, lease := e.cfg.RenewalDefaultLocks, e.cfg.RenewalDefaultLease
	if n <= 0 {
		return nil
	}
	r, err := renewalOnce(ctx, e, n, lease)
	if err != nil {
		return fmt.Errorf("%d locks at lease %v: %w", n, lease, err)
	}
	period := (lease / 3).Seconds()
	logf(e.log, "  renewal %d locks at lease %v: %.1f rt/period, %.0f cmds/period, busy %.2f ms/period, cpu %.3f%%, %d lost",
		n, lease, r.rtPerPeriod, r.cmdsPerPeriod, r.busyMs, r.cpuPct, r.lost)
	lib := fmt.Sprintf("fence %d locks, lease %v", n, lease)
	one := func(v float64) []float64 { return []float64{v} }
	s.set(lib, "round_trips_per_period", newFigure("round trips", one(r.rtPerPeriod), nil))
	s.set(lib, "round_trips_per_second", newFigure("round trips/s", one(r.rtPerPeriod/period), nil))
	s.set(lib, "cmds_per_second", newFigure("server commands/s", one(r.cmdsPerPeriod/period), nil))
	s.set(lib, "busy_ms_per_second", newFigure("ms/s", one(r.busyMs/period), nil))
	s.set(lib, "cpu_pct_core", newFigure("% of one core", one(r.cpuPct), nil))
	s.set(lib, "locks_lost", newFigure("locks lost by the watchdog", one(float64(r.lost)), nil))
	s.Notes = append(s.Notes, fmt.Sprintf("at the default lease (%v, renewals every %v): %s, one repetition, the same method.", lease, lease/3, lib))
	return nil
}

type renewalRep struct {
	rtPerPeriod, cmdsPerPeriod, cpuPct, cpuMsPerPeriod float64
	heapPerLock, goroutines                            float64
	busyMs, roundWallMs, renewedPerPeriod              float64
	floorMs, peerMs                                    float64
	lost                                               int
	lostCause                                          string
}

func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func renewalOnce(ctx context.Context, e *env, n int, lease time.Duration) (*renewalRep, error) {
	cfg := e.cfg
	period := lease / 3
	fl, err := newFenceLocker(e.redis.Addr, fence.WithLease(lease))
	if err != nil {
		return nil, err
	}
	defer fl.Close()

	// Open the connections the setup below will use before the heap is
	// read: go-redis connections carry 64 KiB of buffers each, which are
	// not a cost of holding locks.
	var warm sync.WaitGroup
	for w := 0; w < setupWorkers; w++ {
		warm.Add(1)
		go func() { defer warm.Done(); _ = fl.rdb.Ping(ctx).Err() }()
	}
	warm.Wait()
	g0 := runtime.NumGoroutine()
	h0 := heapNow()
	locks := make([]*fence.Lock, n)
	// Acquire with a few goroutines so that setting up 10,000 locks stays
	// short; the acquisitions are not measured here.
	var wg sync.WaitGroup
	var errs errOnce
	for w := 0; w < setupWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += setupWorkers {
				l, err := fl.c.TryAcquire(ctx, fmt.Sprintf("renewal:%d:%d", n, i))
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
	h1 := heapNow()
	g1 := runtime.NumGoroutine()
	r := &renewalRep{
		heapPerLock: (float64(h1) - float64(h0)) / float64(n),
		goroutines:  float64(g1 - g0),
	}

	// Let the first renewals of the fresh locks settle into their rhythm.
	time.Sleep(period + period/4)

	cnt := fl.Counter()
	before, err := commandStats(ctx, e.ping)
	if err != nil {
		return nil, err
	}
	c0 := cnt.snapshot()
	cpu0 := cpuTime()
	cnt.startTiming()
	t0 := time.Now()
	time.Sleep(time.Duration(cfg.RenewalPeriods) * period)
	// A loaded machine may run a renewal round a little after the window:
	// measure on until every lock was renewed in it (the floor replays
	// each lock's renewal), within a lease, after which a lock not renewed
	// would be lost anyway. The figures are per period of the window.
	for cnt.renewedKeys() < n && time.Since(t0) < time.Duration(cfg.RenewalPeriods)*period+lease {
		time.Sleep(period / 8)
	}
	spans, captured := cnt.stopTiming()
	window := time.Since(t0)
	cpu1 := cpuTime()
	c := cnt.snapshot().sub(c0)
	after, err := commandStats(ctx, e.ping)
	if err != nil {
		return nil, err
	}
	periods := window.Seconds() / period.Seconds()
	r.rtPerPeriod = float64(c.roundTrips) / periods
	r.cmdsPerPeriod = float64(diffStats(before, after).Total) / periods
	r.cpuPct = 100 * (cpu1 - cpu0) / window.Seconds()
	r.cpuMsPerPeriod = 1000 * (cpu1 - cpu0) / periods
	busy := unionLen(spans)
	var renewed int
	for _, sp := range spans {
		renewed += sp.cmds
	}
	r.busyMs = float64(busy) / float64(time.Millisecond) / periods
	r.renewedPerPeriod = float64(renewed) / periods
	r.roundWallMs = median(roundWalls(spans, 20*time.Millisecond))

	// A lock the watchdog lost while nothing else ran is a finding, not a
	// harness error: count it, and leave it out of the floor.
	live := make([]*fence.Lock, 0, len(locks))
	for _, l := range locks {
		if l.Err() != nil {
			r.lost++
			if r.lostCause == "" {
				r.lostCause = fmt.Sprintf("%s: %v", l.Name(), l.Err())
			}
			continue
		}
		live = append(live, l)
	}

	// Floor: the renewal commands the watchdog sent, the latest one per
	// live lock, in one pipeline.
	floor, err := floorPipeline(ctx, e, captured, live)
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	r.floorMs = floor
	peer, err := peerRefreshLoop(ctx, e, n)
	if err != nil {
		return nil, fmt.Errorf("peer loop: %w", err)
	}
	r.peerMs = peer
	return r, nil
}

// roundWalls groups pipeline spans into rounds (gaps shorter than gap) and
// returns each round's wall time in ms.
func roundWalls(spans []span, gap time.Duration) []float64 {
	if len(spans) == 0 {
		return []float64{math.NaN()}
	}
	var out []float64
	start, end := spans[0].start, spans[0].end
	for _, sp := range spans[1:] {
		if sp.start.Sub(end) > gap {
			out = append(out, float64(end.Sub(start))/float64(time.Millisecond))
			start = sp.start
		}
		if sp.end.After(end) {
			end = sp.end
		}
	}
	return append(out, float64(end.Sub(start))/float64(time.Millisecond))
}

func floorPipeline(ctx context.Context, e *env, captured [][]any, live []*fence.Lock) (float64, error) {
	// The latest renewal per key; the key is the first after EVALSHA, sha
	// and the key count.
	byKey := renewalsByKey(captured)
	if len(byKey) < len(live) {
		return 0, fmt.Errorf("captured renewals of %d keys, %d locks are held: the watchdog did not renew every lock during the measurement", len(byKey), len(live))
	}
	all := make([][]any, 0, len(byKey))
	for _, args := range byKey {
		all = append(all, args)
	}
	var runs []float64
	for try := 0; try < 5; try++ {
		pipe := e.ping.Pipeline()
		cmds := make([]*redis.Cmd, 0, len(all))
		t := time.Now()
		for _, args := range all {
			cmds = append(cmds, pipe.Do(ctx, args...))
		}
		_, _ = pipe.Exec(ctx)
		d := time.Since(t)
		for _, c := range cmds {
			if err := c.Err(); err != nil {
				return 0, fmt.Errorf("replayed renewal %v: %w", c.Args(), err)
			}
		}
		runs = append(runs, float64(d)/float64(time.Millisecond))
	}
	// The median of five, as fence's figure is a typical period, not its
	// best one.
	return median(runs), nil
}

// peerRefreshLoop obtains n redislock locks and times refreshing them one
// after another, as its documentation shows.
func peerRefreshLoop(ctx context.Context, e *env, n int) (float64, error) {
	rdb := newRedisClient(e.redis.Addr, nil)
	defer rdb.Close()
	lc := redislock.New(rdb)
	// A TTL long enough that no lock expires while the others are being
	// obtained and refreshed; the TTL value does not change the cost.
	ttl := 30 * time.Second
	locks := make([]*redislock.Lock, n)
	for i := range locks {
		l, err := lc.Obtain(ctx, fmt.Sprintf("redislock:renewal:%d:%d", n, i), ttl, nil)
		if err != nil {
			return 0, err
		}
		locks[i] = l
	}
	t := time.Now()
	for _, l := range locks {
		if err := l.Refresh(ctx, ttl, nil); err != nil {
			return 0, err
		}
	}
	d := time.Since(t)
	pipe := rdb.Pipeline()
	for _, l := range locks {
		pipe.Del(ctx, l.Key())
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	return float64(d) / float64(time.Millisecond), nil
}

// unionLen is the time during which at least one span was in flight, so
// that overlapping pipelines are not counted twice.
func unionLen(spans []span) time.Duration {
	if len(spans) == 0 {
		return 0
	}
	s := slices.Clone(spans)
	slices.SortFunc(s, func(a, b span) int { return a.start.Compare(b.start) })
	var total time.Duration
	start, end := s[0].start, s[0].end
	for _, sp := range s[1:] {
		if sp.start.After(end) {
			total += end.Sub(start)
			start, end = sp.start, sp.end
			continue
		}
		if sp.end.After(end) {
			end = sp.end
		}
	}
	return total + end.Sub(start)
}

// renewalsByKey is the latest captured renewal command per lock key; the
// key is the first after EVALSHA, the sha and the key count.
func renewalsByKey(captured [][]any) map[string][]any {
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
	return byKey
}
