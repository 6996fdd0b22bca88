package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// op is one timed operation of a contender in an interleaved latency run.
type op struct {
	name string
	do   func(ctx context.Context) error
}

func (e *env) pingOp() op {
	return op{"PING", func(ctx context.Context) error { return e.ping.Ping(ctx).Err() }}
}

func acquireReleaseOp(l locker, key string) op {
	return op{l.Name(), func(ctx context.Context) error {
		h, err := l.Acquire(ctx, key)
		if err != nil {
			return err
		}
		return h.Release(ctx)
	}}
}

// interleaved times n runs of every op per repetition, in blocks of 50 so
// that the contenders alternate within the repetition, and returns per op
// the per-repetition medians and all samples (µs).
func interleaved(ctx context.Context, reps, n int, ops []op) (map[string][]float64, map[string][]float64, error) {
	const block = 50
	repMed := map[string][]float64{}
	pooled := map[string][]float64{}
	for rep := 0; rep < reps; rep++ {
		samples := map[string][]float64{}
		order := make([]op, len(ops))
		for i := range ops {
			order[i] = ops[(i+rep)%len(ops)]
		}
		// Warm-up: connections, script cache.
		for _, o := range order {
			for i := 0; i < 20; i++ {
				if err := o.do(ctx); err != nil {
					return nil, nil, fmt.Errorf("%s: %w", o.name, err)
				}
			}
		}
		for done := 0; done < n; done += block {
			for _, o := range order {
				for i := 0; i < block && done+i < n; i++ {
					t := time.Now()
					if err := o.do(ctx); err != nil {
						return nil, nil, fmt.Errorf("%s: %w", o.name, err)
					}
					samples[o.name] = append(samples[o.name], us(time.Since(t)))
				}
			}
		}
		for _, o := range ops {
			repMed[o.name] = append(repMed[o.name], median(samples[o.name]))
			pooled[o.name] = append(pooled[o.name], samples[o.name]...)
		}
	}
	return repMed, pooled, nil
}

func runRTT(ctx context.Context, e *env, res *results) error {
	s := res.scenario("rtt")
	repMed, pooled, err := interleaved(ctx, e.cfg.Reps, e.cfg.RTTOps, []op{e.pingOp()})
	if err != nil {
		return err
	}
	s.set("PING", "latency_us", newFigure("µs", repMed["PING"], pooled["PING"]))
	s.Notes = append(s.Notes, "PING round trip on a plain go-redis client: the physical baseline; acquire+release cannot beat 2 of these.")
	return nil
}

func runUncontended(ctx context.Context, e *env, res *results) error {
	s := res.scenario("uncontended")
	ops := []op{e.pingOp()}
	for _, l := range e.libs {
		ops = append(ops, acquireReleaseOp(l, "uncontended"))
	}
	repMed, pooled, err := interleaved(ctx, e.cfg.Reps, e.cfg.UncontendedOps, ops)
	if err != nil {
		return err
	}
	twoPing := make([]float64, len(repMed["PING"]))
	twoPingPooled := make([]float64, len(pooled["PING"]))
	for i, v := range repMed["PING"] {
		twoPing[i] = 2 * v
	}
	for i, v := range pooled["PING"] {
		twoPingPooled[i] = 2 * v
	}
	s.set("2×PING", "latency_us", newFigure("µs", twoPing, twoPingPooled))
	for _, l := range e.libs {
		s.set(l.Name(), "latency_us", newFigure("µs", repMed[l.Name()], pooled[l.Name()]))
	}
	s.Ratios["fence/2xPING"] = pairedRatio(repMed["fence"], twoPing)
	best := bestPeerPerRep(repMed, e.peerNames(), true)
	s.Ratios["fence/fastest_peer"] = pairedRatio(repMed["fence"], best)
	for _, p := range e.peerNames() {
		s.Ratios["fence/"+p] = pairedRatio(repMed["fence"], repMed[p])
	}
	s.Notes = append(s.Notes, "one goroutine, acquire then release of one name, each pair timed; fence in watchdog mode, a fencing token issued per acquisition.")
	return nil
}

func (e *env) peerNames() []string {
	var out []string
	for _, l := range e.libs {
		if l.Name() != "fence" {
			out = append(out, l.Name())
		}
	}
	return out
}

// bestPeerPerRep picks, per repetition, the best peer value (lowest when
// lower is better).
func bestPeerPerRep(byLib map[string][]float64, peers []string, lowerBetter bool) []float64 {
	var out []float64
	for i := 0; ; i++ {
		var best float64
		found := false
		for _, p := range peers {
			v := byLib[p]
			if i >= len(v) {
				continue
			}
			if !found || (lowerBetter && v[i] < best) || (!lowerBetter && v[i] > best) {
				best, found = v[i], true
			}
		}
		if !found {
			return out
		}
		out = append(out, best)
	}
}

func runParallel(ctx context.Context, e *env, res *results) error {
	s := res.scenario("parallel")
	m, err := measureParallel(ctx, e, e.libs, map[string]bool{"fence": true, "redislock": true})
	if err != nil {
		return err
	}
	for _, l := range e.libs {
		m.record(s, l.Name())
	}
	parallelRatios(s, m.rates, m.srvUs, m.cliUs, e.peerNames())
	s.Notes = append(s.Notes, fmt.Sprintf("%d goroutines, each on its own name, acquire+release in a loop for %v per library per repetition (in %d windows taken in turn with the other libraries'). redis_cpu_us_per_op: Redis server CPU (INFO cpu, user+sys) per acquire+release; client_cpu_us_per_op: the bench process' CPU (getrusage) per acquire+release; client_switches_per_op: its context switches (getrusage) per acquire+release, how often all its goroutines waited for Redis at once and its thread slept. Whichever side saturates its core bounds ops/s.", e.cfg.ParallelWorkers, e.cfg.ParallelDur, parallelSlices),
		"Where the Redis CPU goes (libraries that send only scripts, from INFO commandstats): redis_cmds_per_op, the commands the scripts call; redis_in_commands_us_per_op, their time; redis_in_lua_us_per_op, the scripts' time less that (the Lua call itself); redis_outside_commands_us_per_op, the CPU spent outside any command: reading, parsing and answering the requests, the event loop, the expiry of keys.")
	return nil
}

// parallelFigures are a parallel measurement's per-repetition figures,
// by library.
type parallelFigures struct {
	rates, srvUs, cliUs map[string][]float64
	// cliSw: the bench process' context switches per acquire+release.
	cliSw map[string][]float64
	// split: where the Redis CPU goes, for the libraries that send only
	// scripts.
	split map[string]map[string][]float64
}

// parallelSlices is how many windows each library's time of a
// repetition is cut into, taken in turn with the other libraries'
// (rotated each time): a change of the host's speed within a repetition
// then reaches every library alike, where one window each let a slow
// second decide a ratio.
const parallelSlices = 4

// parallelSum is one library's sums over the windows of a repetition.
type parallelSum struct {
	ops               int64
	secs, srv, cli    float64 // elapsed, Redis CPU and this process' CPU, s
	sw                float64 // this process' context switches
	scriptUs, innerUs float64
	cmds              int64
}

// measureParallel runs parallelOnce for every library of libs in each
// repetition, in parallelSlices windows per library taken in turn
// (rotated), with the Redis server's and this process' CPU around each,
// and the split of the Redis CPU for the libraries of scriptOnly: in the
// commands the scripts call, in the scripts' own running (the Lua call:
// set-up, argument conversion, the replies' conversion), and outside any
// command (reading, parsing and answering requests).
func measureParallel(ctx context.Context, e *env, libs []locker, scriptOnly map[string]bool) (*parallelFigures, error) {
	m := &parallelFigures{rates: map[string][]float64{}, srvUs: map[string][]float64{}, cliUs: map[string][]float64{}, cliSw: map[string][]float64{}, split: map[string]map[string][]float64{}}
	window := e.cfg.ParallelDur / parallelSlices
	for rep := 0; rep < e.cfg.Reps; rep++ {
		sums := map[string]*parallelSum{}
		for slice := 0; slice < parallelSlices; slice++ {
			for _, l := range rotated(libs, rep+slice) {
				st0, err := commandTimes(ctx, e.ping)
				if err != nil {
					return nil, err
				}
				cpu0, err := serverCPU(ctx, e.ping)
				if err != nil {
					return nil, err
				}
				c0, sw0 := usage()
				r, ops, err := parallelOnce(ctx, l, e.cfg.ParallelWorkers, window)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", l.Name(), err)
				}
				c1, sw1 := usage()
				cpu1, err := serverCPU(ctx, e.ping)
				if err != nil {
					return nil, err
				}
				st1, err := commandTimes(ctx, e.ping)
				if err != nil {
					return nil, err
				}
				sum := sums[l.Name()]
				if sum == nil {
					sum = &parallelSum{}
					sums[l.Name()] = sum
				}
				sum.ops += ops
				if r > 0 {
					sum.secs += float64(ops) / r
				}
				sum.srv += cpu1 - cpu0
				sum.cli += c1 - c0
				sum.sw += sw1 - sw0
				if scriptOnly[l.Name()] {
					script, inner, cmds := scriptSplit(st0, st1)
					sum.scriptUs += script
					sum.innerUs += inner
					sum.cmds += cmds
				}
				settle()
			}
		}
		for _, l := range libs {
			sum := sums[l.Name()]
			if sum.ops == 0 || sum.secs == 0 {
				return nil, fmt.Errorf("%s: no operation in %v", l.Name(), e.cfg.ParallelDur)
			}
			n := float64(sum.ops)
			m.rates[l.Name()] = append(m.rates[l.Name()], n/sum.secs)
			srv := 1e6 * sum.srv / n
			m.srvUs[l.Name()] = append(m.srvUs[l.Name()], srv)
			m.cliUs[l.Name()] = append(m.cliUs[l.Name()], 1e6*sum.cli/n)
			m.cliSw[l.Name()] = append(m.cliSw[l.Name()], sum.sw/n)
			if scriptOnly[l.Name()] {
				sp := m.split[l.Name()]
				if sp == nil {
					sp = map[string][]float64{}
					m.split[l.Name()] = sp
				}
				sp["redis_cmds_per_op"] = append(sp["redis_cmds_per_op"], float64(sum.cmds)/n)
				sp["redis_in_commands_us_per_op"] = append(sp["redis_in_commands_us_per_op"], sum.innerUs/n)
				sp["redis_in_lua_us_per_op"] = append(sp["redis_in_lua_us_per_op"], (sum.scriptUs-sum.innerUs)/n)
				sp["redis_outside_commands_us_per_op"] = append(sp["redis_outside_commands_us_per_op"], srv-sum.scriptUs/n)
			}
		}
	}
	return m, nil
}

// record sets lib's figures in s.
func (m *parallelFigures) record(s *scenario, lib string) {
	s.set(lib, "ops_per_s", newFigure("ops/s", m.rates[lib], nil))
	s.set(lib, "redis_cpu_us_per_op", newFigure("µs", m.srvUs[lib], nil))
	s.set(lib, "client_cpu_us_per_op", newFigure("µs", m.cliUs[lib], nil))
	s.set(lib, "client_switches_per_op", newFigure("", m.cliSw[lib], nil))
	for _, k := range []string{"redis_cmds_per_op", "redis_in_commands_us_per_op", "redis_in_lua_us_per_op", "redis_outside_commands_us_per_op"} {
		if v, ok := m.split[lib][k]; ok {
			unit := "µs"
			if k == "redis_cmds_per_op" {
				unit = "commands"
			}
			s.set(lib, k, newFigure(unit, v, nil))
		}
	}
}

// parallelRatios compares fence with the others of the same repetitions:
// ops/s with the best peer, and the Redis server's and the bench process'
// CPU per acquire+release with redislock's.
func parallelRatios(s *scenario, rates, srvUs, cliUs map[string][]float64, peers []string) {
	s.Ratios["fence/best_peer"] = pairedRatio(rates["fence"], bestPeerPerRep(rates, peers, false))
	s.Ratios["redis_cpu fence/redislock"] = pairedRatio(srvUs["fence"], srvUs["redislock"])
	s.Ratios["client_cpu fence/redislock"] = pairedRatio(cliUs["fence"], cliUs["redislock"])
}

func parallelOnce(ctx context.Context, l locker, workers int, d time.Duration) (float64, int64, error) {
	var ops atomic.Int64
	var wg sync.WaitGroup
	var firstErr errOnce
	stop := time.Now().Add(d)
	start := time.Now()
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			key := fmt.Sprintf("parallel:%d", i)
			for time.Now().Before(stop) {
				h, err := l.Acquire(ctx, key)
				if err == nil {
					err = h.Release(ctx)
				}
				if err != nil {
					firstErr.set(err)
					return
				}
				ops.Add(1)
			}
		}(i)
	}
	wg.Wait()
	if err := firstErr.get(); err != nil {
		return 0, 0, err
	}
	return float64(ops.Load()) / time.Since(start).Seconds(), ops.Load(), nil
}

// errOnce keeps the first error of several goroutines.
type errOnce struct {
	mu  sync.Mutex
	err error
}

func (o *errOnce) set(err error) {
	o.mu.Lock()
	if o.err == nil {
		o.err = err
	}
	o.mu.Unlock()
}

func (o *errOnce) get() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}
