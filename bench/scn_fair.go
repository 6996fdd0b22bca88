package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/fence"
)

// The fair lock's scenarios besides the handover (scn_handoff2.go):
// fairness across processes, a long queue, and dead waiters at its head.
// In fair, fence is measured against the Redis peers at their documented
// settings, and etcd's Mutex when the run has an etcd server, in the same
// run.

// call is one acquisition of a contender, in Unix ns on the real-time
// clock every process of the run reads.
type call struct {
	client          int
	start, acquired int64
	waited          int64 // when its library said it waits; 0: did not wait
}

type callKey struct{}

// redisPeers are the Redis lock libraries fence is compared with in the
// fair scenario, at their documented settings (never redislock-1ms).
var redisPeers = []string{"redislock", "redsync"}

// fairLibs are the libraries of the fair scenario: fence, the Redis peers
// and, when the run has an etcd server, etcd.
func (e *env) fairLibs() []string {
	libs := append([]string{"fence"}, redisPeers...)
	if e.etcd != nil {
		libs = append(libs, etcdName)
	}
	return libs
}

// fairAgg is one library's figures in fair, per repetition.
type fairAgg struct{ acq, minMax, ooo, cpu, fails []float64 }

// runFair: 4 processes × 4 goroutines on one name, 1 ms hold: acquisitions
// per process (min/max), grants out of arrival order, acquisitions/s and
// the lock server's CPU per acquisition.
func runFair(ctx context.Context, e *env, res *results) error {
	s := res.scenario("fair")
	libs := e.fairLibs()
	a := map[string]*fairAgg{}
	for _, l := range libs {
		a[l] = &fairAgg{}
	}
	// The contender processes live through every repetition.
	procs := map[string][]*child{}
	defer func() {
		for _, cs := range procs {
			stopAll(cs)
		}
	}()
	for _, lib := range libs {
		r := e.role("contender", lib)
		r.Name, r.Goroutines, r.Hold = "fair", e.cfg.FairGoroutines, e.cfg.FairHold
		for range e.cfg.FairClients {
			c, err := startChild(ctx, r)
			if err != nil {
				return fmt.Errorf("%s: %w", lib, err)
			}
			procs[lib] = append(procs[lib], c)
		}
	}
	for rep := 0; rep < e.cfg.Reps; rep++ {
		for i := range libs {
			lib := libs[(i+rep)%len(libs)]
			if err := fairRep(ctx, e, lib, procs[lib], a[lib], rep); err != nil {
				return fmt.Errorf("%s: %w", lib, err)
			}
			settle()
		}
	}
	for _, l := range libs {
		g := a[l]
		s.set(l, "acq_per_s", newFigure("acquisitions/s", g.acq, nil))
		s.set(l, "min_max", newFigure("ratio", g.minMax, nil))
		if len(g.ooo) > 0 {
			s.set(l, "out_of_order", newFigure("grants/repetition", g.ooo, nil))
		}
		s.set(l, "server_cpu_us_per_acq", newFigure("µs", g.cpu, nil))
		s.set(l, "failed_acquires", newFigure("count/repetition", g.fails, nil))
	}
	fairRatios(s, a)
	s.Notes = append(s.Notes, fmt.Sprintf("%d processes (each its own go-redis and lock client, or etcd client with a session per goroutine) × %d goroutines on one name, hold %v, %v per library per repetition, started together; a goroutine calls Acquire again as soon as it released. The Redis peers at their documented settings (redislock LinearBackoff(%v), redsync's defaults). min_max: fewest / most acquisitions of one process. out_of_order: acquisitions that came before that of a call which was already waiting (its library's WaitObserver had fired) when the acquiring call began, compared across processes on the real-time clock (not measured for the libraries that do not say when they wait: etcd's Mutex, redislock, redsync). server_cpu_us_per_acq: the lock server's CPU (Redis: INFO cpu, user+sys; etcd: /proc/<pid>/stat) / acquisitions. failed_acquires: Acquire calls that gave up before the end of the window (redsync after its 32 tries); the goroutine then calls Acquire again.", e.cfg.FairClients, e.cfg.FairGoroutines, e.cfg.FairHold, e.cfg.ContendedDur, redislockBackoff))
	return nil
}

// fairRep runs lib's contender processes once and adds the repetition's
// figures to g.
func fairRep(ctx context.Context, e *env, lib string, cs []*child, g *fairAgg, rep int) error {
	calls, cpu, fails, err := fairOnce(ctx, e, lib, cs)
	if err != nil {
		return err
	}
	per := make([]int64, len(cs))
	for _, c := range calls {
		per[c.client]++
	}
	mn, mx := slices.Min(per), slices.Max(per)
	g.acq = append(g.acq, float64(len(calls))/e.cfg.ContendedDur.Seconds())
	g.minMax = append(g.minMax, float64(mn)/math.Max(1, float64(mx)))
	g.cpu = append(g.cpu, 1e6*cpu/math.Max(1, float64(len(calls))))
	g.fails = append(g.fails, float64(fails))
	ooo := "–"
	if saysWhenWaiting(lib) {
		g.ooo = append(g.ooo, float64(outOfOrder(calls)))
		ooo = strconv.Itoa(int(g.ooo[len(g.ooo)-1]))
	}
	logf(e.log, "  fair %s rep %d: per process %v, %s out of order, %.0f acq/s, %d gave up", lib, rep, per, ooo, g.acq[len(g.acq)-1], fails)
	return nil
}

// fairRatios compares fence with the others of the same repetitions:
// acquisitions/s with the best Redis peer (the highest of the repetition)
// and the lock server's CPU per acquisition with the best Redis peer (the
// lowest); and both with etcd's, when it ran.
func fairRatios(s *scenario, a map[string]*fairAgg) {
	acq, cpu := map[string][]float64{}, map[string][]float64{}
	for l, g := range a {
		acq[l], cpu[l] = g.acq, g.cpu
	}
	f := a["fence"]
	s.Ratios["acq_per_s fence/best_redis_peer"] = pairedRatio(f.acq, bestPeerPerRep(acq, redisPeers, false))
	s.Ratios["server_cpu fence/best_redis_peer"] = pairedRatio(f.cpu, bestPeerPerRep(cpu, redisPeers, true))
	if _, ok := a[etcdName]; ok {
		s.Ratios["acq_per_s fence/"+etcdName] = pairedRatio(f.acq, acq[etcdName])
		s.Ratios["server_cpu fence/"+etcdName] = pairedRatio(f.cpu, cpu[etcdName])
	}
}

// fairOnce runs the contender processes of one library once: their calls,
// the lock server's CPU seconds over the run, and the Acquire calls that
// gave up.
func fairOnce(ctx context.Context, e *env, lib string, cs []*child) ([]call, float64, int64, error) {
	cpu0, err := e.lockServerCPU(ctx, lib)
	if err != nil {
		return nil, 0, 0, err
	}
	// Every process starts at the same moment, 50 ms from now.
	start := time.Now().Add(50 * time.Millisecond)
	stop := start.Add(e.cfg.ContendedDur)
	for _, c := range cs {
		if err := c.send("go %d %d", start.UnixNano(), stop.UnixNano()); err != nil {
			return nil, 0, 0, err
		}
	}
	var (
		calls []call
		fails int64
	)
	limit := e.cfg.ContendedDur + time.Minute
	for ci, c := range cs {
		for {
			l, err := c.next(ctx, limit)
			if err != nil {
				return nil, 0, 0, err
			}
			if rest, ok := strings.CutPrefix(l, "end "); ok {
				f, err := parseInts(rest)
				if err != nil || len(f) != 2 {
					return nil, 0, 0, fmt.Errorf("contender said %q", l)
				}
				fails += f[1]
				break
			}
			rest, ok := strings.CutPrefix(l, "c ")
			f, err := parseInts(rest)
			if !ok || err != nil || len(f) != 3 {
				return nil, 0, 0, fmt.Errorf("contender said %q", l)
			}
			calls = append(calls, call{client: ci, start: f[0], waited: f[1], acquired: f[2]})
		}
	}
	cpu1, err := e.lockServerCPU(ctx, lib)
	if err != nil {
		return nil, 0, 0, err
	}
	return calls, cpu1 - cpu0, fails, nil
}

// lockServerCPU is the CPU time (s) of the server lib locks on.
func (e *env) lockServerCPU(ctx context.Context, lib string) (float64, error) {
	if lib == etcdName {
		return e.etcd.cpuSeconds()
	}
	return serverCPU(ctx, e.ping)
}

// contenderRole: on each "go <start> <stop>", from start until stop, each
// of the role's goroutines acquires the name, holds it, releases it,
// again; then it says "c <start> <waited> <acquired>" per acquisition made
// before stop and "end <n> <gave up>". It ends when its stdin closes.
func contenderRole(r role, in *bufio.Scanner, out *lineWriter) error {
	var mu sync.Mutex
	waits := map[int64]int64{}
	var onWait waitFunc
	if saysWhenWaiting(r.Lib) {
		onWait = func(ctx context.Context) {
			if id, ok := ctx.Value(callKey{}).(int64); ok {
				now := time.Now().UnixNano()
				mu.Lock()
				waits[id] = now
				mu.Unlock()
			}
		}
	}
	l, err := openLib(r, onWait)
	if err != nil {
		return err
	}
	defer l.Close()
	out.say("ready")
	var ids atomic.Int64
	return serveCommands(in, func(cmd string) error {
		rest, ok := strings.CutPrefix(cmd, "go ")
		t, err := parseInts(rest)
		if !ok || err != nil || len(t) != 2 {
			return fmt.Errorf("unknown command %q", cmd)
		}
		calls, fails, err := contend(l, r, &ids, &mu, waits, time.Unix(0, t[0]), time.Unix(0, t[1]))
		if err != nil {
			return err
		}
		out.mu.Lock()
		for _, c := range calls {
			fmt.Fprintf(out.w, "c %d %d %d\n", c.start, c.waited, c.acquired)
		}
		fmt.Fprintf(out.w, "end %d %d\n", len(calls), fails)
		err = out.w.Flush()
		out.mu.Unlock()
		return err
	})
}

// contend runs r.Goroutines goroutines on the name from start until stop:
// their acquisitions, and how many Acquire calls gave up (a peer's).
func contend(l locker, r role, ids *atomic.Int64, mu *sync.Mutex, waits map[int64]int64, start, stop time.Time) ([]call, int64, error) {
	time.Sleep(time.Until(start))
	runCtx, cancel := context.WithDeadline(context.Background(), stop)
	defer cancel()
	var (
		calls []call
		fails atomic.Int64
		errs  errOnce
		wg    sync.WaitGroup
	)
	for range r.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				id := ids.Add(1)
				c := call{start: time.Now().UnixNano()}
				h, err := l.Acquire(context.WithValue(runCtx, callKey{}, id), r.Name)
				if err != nil && runCtx.Err() == nil && gaveUp(err) {
					fails.Add(1)
					continue
				}
				if err != nil {
					if runCtx.Err() == nil {
						errs.set(err)
					}
					return
				}
				c.acquired = time.Now().UnixNano()
				mu.Lock()
				c.waited = waits[id]
				delete(waits, id)
				mu.Unlock()
				time.Sleep(r.Hold)
				if err := h.Release(context.Background()); err != nil {
					errs.set(fmt.Errorf("release: %w", err))
					return
				}
				if c.acquired < stop.UnixNano() {
					mu.Lock()
					calls = append(calls, c)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	// Waits of calls that ended without the lock.
	mu.Lock()
	clear(waits)
	mu.Unlock()
	return calls, fails.Load(), errs.get()
}

// outOfOrder counts acquisitions b that came before the acquisition of a
// call a which was already waiting when b began.
func outOfOrder(calls []call) int {
	n := 0
	for _, b := range calls {
		for _, a := range calls {
			if a.waited != 0 && a.waited < b.start && b.acquired < a.acquired {
				n++
				break
			}
		}
	}
	return n
}

// runQueue10k: a long queue of one name: Redis memory per waiter, and how
// long a release (a handover) runs on the server (SLOWLOG).
func runQueue10k(ctx context.Context, e *env, res *results) error {
	s := res.scenario("queue")
	n := e.cfg.QueueWaiters
	holders := e.cfg.QueueReleases
	rdb := redis.NewClient(&redis.Options{Addr: e.redis.Addr, PoolSize: 64})
	defer rdb.Close()
	// Heartbeats every liveness/3: the memory is sampled over two periods.
	liveness := e.cfg.QueueLiveness
	fc, err := fence.New(rdb, fence.WithPrefix("q10k:"), fence.WithLiveness(liveness))
	if err != nil {
		return err
	}
	defer fc.Close(context.WithoutCancel(ctx))
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	held, err := fc.Acquire(wctx, "long")
	if err != nil {
		return err
	}
	// The pool's connections exist before the baseline: their buffers are
	// not the waiters' cost.
	var pw sync.WaitGroup
	for range 64 {
		pw.Add(1)
		go func() { defer pw.Done(); _ = rdb.Ping(ctx).Err() }()
	}
	pw.Wait()
	// The floor over the same span as afterwards: Redis frees the query
	// buffers of connections idle for 2 s, the pool's among them.
	mem0, _, err := usedMemoryRange(ctx, e.ping, max(2*liveness/3, 2*time.Second))
	if err != nil {
		return err
	}
	got := make(chan *fence.Lock, n)
	for range n {
		go func() {
			l, err := fc.Acquire(wctx, "long", fence.WithWaitLimit(5*time.Minute))
			if err == nil {
				got <- l
			} else {
				got <- nil
			}
		}()
	}
	hash := "q10k:{long}:w"
	for {
		c, err := e.ping.HLen(ctx, hash).Result()
		if err != nil {
			return err
		}
		if c == int64(n) {
			break
		}
		if wctx.Err() != nil {
			return fmt.Errorf("only %d of %d waiters queued", c, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// used_memory over two heartbeat periods: its floor is what the
	// queue keeps; its peak adds the buffers of a heartbeat round (one
	// pipeline of every waiter's heartbeat, read and answered at once).
	memLow, memHigh, err := usedMemoryRange(ctx, e.ping, max(2*liveness/3, 2*time.Second))
	if err != nil {
		return err
	}
	qb, _ := e.ping.MemoryUsage(ctx, "q10k:{long}:q", 0).Result()
	hb, _ := e.ping.MemoryUsage(ctx, hash, 0).Result()
	// SLOWLOG every command, then hand over a few times.
	_ = e.ping.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err()
	_ = e.ping.ConfigSet(ctx, "slowlog-max-len", "100000").Err() // heartbeat rounds are logged too
	_ = e.ping.Do(ctx, "SLOWLOG", "RESET").Err()
	l := held
	released := map[string]bool{} // the released locks' values
	for i := 0; i < holders; i++ {
		released[strconv.FormatInt(l.Token(), 10)+":"+l.Holder()] = true
		if err := l.Release(ctx); err != nil {
			return err
		}
		if l = <-got; l == nil {
			return errors.New("a waiter did not get the lock")
		}
	}
	entries, err := e.ping.SlowLogGet(ctx, -1).Result()
	_ = e.ping.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err()
	_ = e.ping.ConfigSet(ctx, "slowlog-max-len", "128").Err()
	if err != nil {
		return err
	}
	// release.lua's call ends with the released lock's value,
	// "<token>:<holder>" (renew.lua's with a lease after it). A release
	// whose EVALSHA met NOSCRIPT (a Redis that never ran the script: the
	// scenario run alone) is logged twice, the EVALSHA and then the EVAL
	// that ran it: the EVAL is the release.
	byValue := map[string]float64{}
	for _, en := range entries {
		if len(en.Args) == 0 || !released[en.Args[len(en.Args)-1]] {
			continue
		}
		v, us := en.Args[len(en.Args)-1], float64(en.Duration.Microseconds())
		switch cmd := strings.ToLower(en.Args[0]); {
		case cmd == "eval":
			byValue[v] = us
		case cmd == "evalsha":
			if _, ok := byValue[v]; !ok {
				byValue[v] = us
			}
		}
	}
	relUs := make([]float64, 0, len(byValue))
	for _, us := range byValue {
		relUs = append(relUs, us)
	}
	if len(relUs) != holders {
		return fmt.Errorf("SLOWLOG holds %d of the %d releases", len(relUs), holders)
	}
	cancel() // the other waiters leave
	_ = l.Release(context.WithoutCancel(ctx))
	perWaiter := float64(memLow-mem0) / float64(n)
	s.set("fence", "memory_per_waiter_bytes", newFigure("bytes (INFO used_memory floor − before, / waiters)", []float64{perWaiter}, nil))
	s.set("fence", "memory_peak_per_waiter_bytes", newFigure("bytes (INFO used_memory peak − before, / waiters)", []float64{float64(memHigh-mem0) / float64(n)}, nil))
	s.set("fence", "memory_usage_per_waiter_bytes", newFigure("bytes (MEMORY USAGE SAMPLES 0 of the two keys / waiters)", []float64{float64(qb+hb) / float64(n)}, nil))
	if len(relUs) > 0 {
		s.set("fence", "release_slowlog_us", newFigure("µs", relUs, nil))
	}
	s.Notes = append(s.Notes, fmt.Sprintf("%d waiters (one client, default holder ids, liveness %v: a heartbeat every %v) queued on one held name; memory: INFO used_memory before they queued and, sampled every 50 ms for two heartbeat periods (at least 2 s) after, its floor (everything the queue keeps on the server: keys, hash table, list) and its peak (adding the buffers of a heartbeat round: every waiter's heartbeat in one pipeline), and MEMORY USAGE (all elements counted) of the queue's two keys. release: SLOWLOG duration of release.lua (a handover to the head of the queue) in %d releases with the queue full (the goal: their median).", n, liveness, liveness/3, holders))
	return nil
}

// usedMemoryRange samples used_memory every 50 ms for d: its floor and
// its peak.
func usedMemoryRange(ctx context.Context, c *redis.Client, d time.Duration) (low, high int64, err error) {
	for t := time.Now(); time.Since(t) < d; time.Sleep(50 * time.Millisecond) {
		m, err := usedMemory(ctx, c)
		if err != nil {
			return 0, 0, err
		}
		if low == 0 || m < low {
			low = m
		}
		high = max(high, m)
	}
	return low, high, nil
}

func usedMemory(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("no used_memory in INFO memory")
}

// headKillRole is a headkill waiter: it waits for the lock (liveness
// from the role) until it is killed, or its stdin closes.
func headKillRole(r role, in *bufio.Scanner, out *lineWriter) error {
	rdb := redis.NewClient(&redis.Options{Addr: r.Redis})
	defer rdb.Close()
	c, err := fence.New(rdb, fence.WithPrefix("hk:"), fence.WithLiveness(r.Liveness))
	if err != nil {
		return err
	}
	out.say("ready")
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = c.Acquire(ctx, r.Name, fence.WithHolder(r.Holder), fence.WithWaitLimit(time.Hour))
	}()
	waitForEOF(in)
	cancel()
	return c.Close(context.Background())
}

// runHeadKill: 5 waiter processes at the head of the queue are SIGKILLed;
// the holder releases; how long until the next live waiter holds the lock.
func runHeadKill(ctx context.Context, e *env, res *results) error {
	s := res.scenario("headkill")
	const dead = 5
	liveness := e.cfg.HeadLiveness
	var took []float64
	for rep := 0; rep < e.cfg.Reps; rep++ {
		d, err := headKillOnce(ctx, e, dead, liveness, rep)
		if err != nil {
			return err
		}
		took = append(took, d.Seconds())
		logf(e.log, "  headkill rep %d: next live waiter after %v", rep, d)
	}
	s.set("fence", "next_holder_s", newFigure("s", took, nil))
	s.Notes = append(s.Notes, fmt.Sprintf("%d waiter processes (liveness %v) queue first, one live waiter after them (its own client, in the bench process); the %d are SIGKILLed, then the holder releases: time from the kill to the live waiter's Acquire returning.", dead, liveness, dead))
	return nil
}

func headKillOnce(ctx context.Context, e *env, dead int, liveness time.Duration, rep int) (time.Duration, error) {
	name := "hk" + strconv.Itoa(rep)
	rdb := redis.NewClient(&redis.Options{Addr: e.redis.Addr})
	defer rdb.Close()
	holder, err := fence.New(rdb, fence.WithPrefix("hk:"))
	if err != nil {
		return 0, err
	}
	defer holder.Close(context.WithoutCancel(ctx))
	l, err := holder.Acquire(ctx, name)
	if err != nil {
		return 0, err
	}
	var procs []*child
	defer func() { stopAll(procs) }()
	hash := "hk:{" + name + "}:w"
	for i := range dead {
		r := e.role("headkill", "fence")
		r.Name, r.Holder, r.Liveness = name, "dead"+strconv.Itoa(i), liveness
		c, err := startChild(ctx, r)
		if err != nil {
			return 0, err
		}
		procs = append(procs, c)
		if err := waitHLen(ctx, e.ping, hash, int64(i+1)); err != nil {
			return 0, err
		}
	}
	other := redis.NewClient(&redis.Options{Addr: e.redis.Addr})
	defer other.Close()
	live, err := fence.New(other, fence.WithPrefix("hk:"), fence.WithLiveness(liveness))
	if err != nil {
		return 0, err
	}
	defer live.Close(context.WithoutCancel(ctx))
	got := make(chan error, 1)
	var at time.Time
	go func() {
		wl, err := live.Acquire(ctx, name, fence.WithWaitLimit(time.Minute))
		at = time.Now()
		if err == nil {
			_ = wl.Release(context.WithoutCancel(ctx))
		}
		got <- err
	}()
	if err := waitHLen(ctx, e.ping, hash, int64(dead+1)); err != nil {
		return 0, err
	}
	killed := time.Now()
	for _, p := range procs {
		_ = p.cmd.Process.Kill()
	}
	if err := l.Release(ctx); err != nil {
		return 0, err
	}
	if err := <-got; err != nil {
		return 0, err
	}
	return at.Sub(killed), nil
}

func waitHLen(ctx context.Context, c *redis.Client, key string, n int64) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		got, err := c.HLen(ctx, key).Result()
		if err == nil && got == n {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("queue %s: %d waiters, want %d", key, got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
