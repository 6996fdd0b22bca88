package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/bench/internal/prequeue"
	"github.com/fencelock/fencelock/fence"
)

// The fair lock's scenarios: a handover between two clients (as two
// processes would be), fairness across clients, a long queue, and dead
// waiters at its head. fence is measured against fence-today (the
// pre-queue library) in the same run.

// lockerPair makes two independent instances of a library (each its own
// go-redis client and lock client), as two processes would have.
type factory struct {
	name string
	make func() (locker, error)
}

func (e *env) fairFactories(obs func() any) []factory {
	addr := e.redis.Addr
	return []factory{
		{"fence", func() (locker, error) {
			var opts []fence.ClientOption
			if o := obs(); o != nil {
				opts = append(opts, fence.WithObserver(o))
			}
			return newFenceLocker(addr, opts...)
		}},
		{todayName, func() (locker, error) {
			var opts []prequeue.ClientOption
			if o := obs(); o != nil {
				opts = append(opts, prequeue.WithObserver(o))
			}
			return newTodayLocker(addr, opts...)
		}},
	}
}

func closeAll(ls []locker) {
	for _, l := range ls {
		l.Close()
	}
}

func makeN(f factory, n int) ([]locker, error) {
	var ls []locker
	for range n {
		l, err := f.make()
		if err != nil {
			closeAll(ls)
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// runHandoff2 is handoff with each side its own client: the release must
// reach the other client through Redis.
func runHandoff2(ctx context.Context, e *env, res *results) error {
	s := res.scenario("handoff2")
	repMed := map[string][]float64{}
	pooled := map[string][]float64{}
	var pingRep, idleRep []float64
	facts := e.fairFactories(func() any { return nil })
	for rep := 0; rep < e.cfg.Reps; rep++ {
		pm, _, err := interleaved(ctx, 1, 200, []op{e.pingOp()})
		if err != nil {
			return err
		}
		pingRep = append(pingRep, pm["PING"][0])
		idle, err := idlePings(ctx, e.ping, e.cfg.HandoffRounds, e.cfg.HandoffHold)
		if err != nil {
			return err
		}
		idleRep = append(idleRep, median(idle))
		for i := range facts {
			f := facts[(i+rep)%len(facts)]
			ls, err := makeN(f, 2)
			if err != nil {
				return err
			}
			gaps, err := handoffPair(ctx, ls[0], ls[1], e.cfg.HandoffRounds, e.cfg.HandoffHold)
			closeAll(ls)
			if err != nil {
				return fmt.Errorf("%s: %w", f.name, err)
			}
			repMed[f.name] = append(repMed[f.name], median(gaps))
			pooled[f.name] = append(pooled[f.name], gaps...)
			settle()
		}
	}
	s.set("PING", "gap_us", newFigure("µs", pingRep, nil))
	s.set("PING after idle", "gap_us", newFigure("µs", idleRep, nil))
	for _, f := range facts {
		s.set(f.name, "gap_us", newFigure("µs", repMed[f.name], pooled[f.name]))
	}
	s.Ratios["fence/PING"] = pairedRatio(repMed["fence"], pingRep)
	s.Ratios["fence/PING_after_idle"] = pairedRatio(repMed["fence"], idleRep)
	s.Ratios[todayName+"/PING_after_idle"] = pairedRatio(repMed[todayName], idleRep)
	s.Ratios[todayName+"/fence"] = pairedRatio(repMed[todayName], repMed["fence"])
	s.Ratios[todayName+"/PING"] = pairedRatio(repMed[todayName], pingRep)
	s.Notes = append(s.Notes, fmt.Sprintf("2 clients (each its own go-redis client and lock client, as two processes would be), one name: the holder holds %v and releases while the other client is already waiting in Acquire; gap = from the start of Release to the return of the other client's Acquire. %d handoffs per library per repetition. PING: back-to-back PINGs (hot); PING after idle: one PING after %v without traffic, as every handoff comes after the hold: on these virtual machines an idle server and client wake up far slower than a busy pair answers, so the handoff is compared with the round trip of the same idle shape.", e.cfg.HandoffHold, e.cfg.HandoffRounds, e.cfg.HandoffHold))
	return nil
}

// idlePings times PINGs each sent after hold without traffic, in µs.
func idlePings(ctx context.Context, c *redis.Client, n int, hold time.Duration) ([]float64, error) {
	var out []float64
	for range n {
		time.Sleep(hold)
		t0 := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			return nil, err
		}
		out = append(out, us(time.Since(t0)))
	}
	return out, nil
}

// handoffPair ping-pongs one lock between two clients, one goroutine each.
func handoffPair(ctx context.Context, a, b locker, rounds int, hold time.Duration) ([]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	key := "handoff2"
	var (
		gaps     []float64
		relStart atomic.Int64
		mu       sync.Mutex
		errs     errOnce
		wg       sync.WaitGroup
		turn     = [2]chan struct{}{make(chan struct{}, 1), make(chan struct{}, 1)}
		done     = make(chan struct{})
		once     sync.Once
	)
	finish := func() { once.Do(func() { close(done) }) }
	side := func(i int, l locker) {
		defer wg.Done()
		var h held
		var err error
		if i == 0 {
			if h, err = l.Acquire(ctx, key); err != nil {
				errs.set(err)
				finish()
				return
			}
		}
		for {
			if h == nil {
				select {
				case <-turn[i]:
				case <-done:
					return
				}
				if h, err = l.Acquire(ctx, key); err != nil {
					errs.set(err)
					finish()
					return
				}
				t1 := time.Now().UnixNano()
				mu.Lock()
				gaps = append(gaps, float64(t1-relStart.Load())/1e3)
				n := len(gaps)
				mu.Unlock()
				if n >= rounds {
					finish()
					_ = h.Release(context.WithoutCancel(ctx))
					return
				}
			}
			turn[1-i] <- struct{}{}
			select {
			case <-time.After(hold): // the other side is waiting by now
			case <-done:
				_ = h.Release(context.WithoutCancel(ctx))
				return
			}
			relStart.Store(time.Now().UnixNano())
			if err := h.Release(ctx); err != nil {
				errs.set(fmt.Errorf("release: %w", err))
				finish()
				return
			}
			h = nil
		}
	}
	wg.Add(2)
	go side(0, a)
	go side(1, b)
	wg.Wait()
	return gaps, errs.get()
}

// waitClock records, per Acquire call (by a ctx value), when it started
// and when the library said it waits (its WaitObserver): a call that was
// waiting before another one started has arrived first.
type waitClock struct {
	mu    sync.Mutex
	waits map[int64]time.Time
}

type callKey struct{}

func (w *waitClock) OnWait(ctx context.Context, _ fence.WaitEvent) { w.note(ctx) }

type waitClockToday struct{ *waitClock }

func (w waitClockToday) OnWait(ctx context.Context, _ prequeue.WaitEvent) { w.note(ctx) }

func (w *waitClock) note(ctx context.Context) {
	if id, ok := ctx.Value(callKey{}).(int64); ok {
		w.mu.Lock()
		w.waits[id] = time.Now()
		w.mu.Unlock()
	}
}

type call struct {
	client          int
	start, acquired time.Time
	waited          time.Time // zero: did not wait
}

// runFair: 4 clients × 4 goroutines on one name, 1 ms hold: acquisitions
// per client (min/max), grants out of arrival order, acquisitions/s and
// Redis CPU per acquisition, fence against fence-today.
func runFair(ctx context.Context, e *env, res *results) error {
	s := res.scenario("fair")
	type agg struct{ acq, minMax, ooo, cpu []float64 }
	a := map[string]*agg{}
	clock := &waitClock{waits: map[int64]time.Time{}}
	facts := e.fairFactories(func() any { return nil })
	facts[0].make = func() (locker, error) { return newFenceLocker(e.redis.Addr, fence.WithObserver(clock)) }
	facts[1].make = func() (locker, error) {
		return newTodayLocker(e.redis.Addr, prequeue.WithObserver(waitClockToday{clock}))
	}
	for _, f := range facts {
		a[f.name] = &agg{}
	}
	for rep := 0; rep < e.cfg.Reps; rep++ {
		for i := range facts {
			f := facts[(i+rep)%len(facts)]
			ls, err := makeN(f, e.cfg.FairClients)
			if err != nil {
				return err
			}
			cpu0, err := serverCPU(ctx, e.ping)
			if err != nil {
				closeAll(ls)
				return err
			}
			calls, err := fairOnce(ctx, ls, clock, e.cfg.FairGoroutines, e.cfg.FairHold, e.cfg.ContendedDur)
			cpu1, cerr := serverCPU(ctx, e.ping)
			closeAll(ls)
			if err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", f.name, err)
			}
			per := make([]int64, e.cfg.FairClients)
			for _, c := range calls {
				per[c.client]++
			}
			mn, mx := slices.Min(per), slices.Max(per)
			g := a[f.name]
			g.acq = append(g.acq, float64(len(calls))/e.cfg.ContendedDur.Seconds())
			g.minMax = append(g.minMax, float64(mn)/math.Max(1, float64(mx)))
			g.ooo = append(g.ooo, float64(outOfOrder(calls)))
			g.cpu = append(g.cpu, 1e6*(cpu1-cpu0)/math.Max(1, float64(len(calls))))
			logf(e.log, "  fair %s rep %d: per client %v, %d out of order, %.0f acq/s", f.name, rep, per, int(g.ooo[len(g.ooo)-1]), g.acq[len(g.acq)-1])
			settle()
		}
	}
	for _, f := range facts {
		g := a[f.name]
		s.set(f.name, "acq_per_s", newFigure("acquisitions/s", g.acq, nil))
		s.set(f.name, "min_max", newFigure("ratio", g.minMax, nil))
		s.set(f.name, "out_of_order", newFigure("grants/repetition", g.ooo, nil))
		s.set(f.name, "redis_cpu_us_per_acq", newFigure("µs", g.cpu, nil))
	}
	s.Ratios["acq_per_s fence/"+todayName] = pairedRatio(a["fence"].acq, a[todayName].acq)
	s.Ratios["redis_cpu fence/"+todayName] = pairedRatio(a["fence"].cpu, a[todayName].cpu)
	s.Notes = append(s.Notes, fmt.Sprintf("%d clients (each its own go-redis client and lock client, as processes would be) × %d goroutines on one name, hold %v, %v per library per repetition. min_max: fewest / most acquisitions of one client. out_of_order: acquisitions that came before that of a call which was already waiting (its library's WaitObserver had fired) when the acquiring call began. redis_cpu_us_per_acq: Redis server CPU (INFO cpu, user+sys) / acquisitions.", e.cfg.FairClients, e.cfg.FairGoroutines, e.cfg.FairHold, e.cfg.ContendedDur))
	return nil
}

func fairOnce(ctx context.Context, ls []locker, clock *waitClock, goroutines int, hold, dur time.Duration) ([]call, error) {
	stop := time.Now().Add(dur)
	runCtx, cancel := context.WithDeadline(ctx, stop)
	defer cancel()
	var (
		mu    sync.Mutex
		calls []call
		ids   atomic.Int64
		errs  errOnce
		wg    sync.WaitGroup
	)
	for ci, l := range ls {
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					id := ids.Add(1)
					c := call{client: ci, start: time.Now()}
					h, err := l.Acquire(context.WithValue(runCtx, callKey{}, id), "fair")
					if err != nil {
						if runCtx.Err() == nil {
							errs.set(err)
						}
						return
					}
					c.acquired = time.Now()
					clock.mu.Lock()
					c.waited = clock.waits[id]
					delete(clock.waits, id)
					clock.mu.Unlock()
					time.Sleep(hold)
					_ = h.Release(context.WithoutCancel(ctx))
					if c.acquired.Before(stop) {
						mu.Lock()
						calls = append(calls, c)
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	return calls, errs.get()
}

// outOfOrder counts acquisitions b that came before the acquisition of a
// call a which was already waiting when b began.
func outOfOrder(calls []call) int {
	n := 0
	for _, b := range calls {
		for _, a := range calls {
			if !a.waited.IsZero() && a.waited.Before(b.start) && b.acquired.Before(a.acquired) {
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
	const holders = 8
	rdb := redis.NewClient(&redis.Options{Addr: e.redis.Addr, PoolSize: 64})
	defer rdb.Close()
	fc, err := fence.New(rdb, fence.WithPrefix("q10k:"))
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
	mem0, _, err := usedMemoryRange(ctx, e.ping, 2*fence.DefaultLiveness/3*2)
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
	memLow, memHigh, err := usedMemoryRange(ctx, e.ping, 2*fence.DefaultLiveness/3*2)
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
	var releases int
	for i := 0; i < holders; i++ {
		if err := l.Release(ctx); err != nil {
			return err
		}
		releases++
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
	var relUs []float64
	for _, en := range entries {
		// release.lua's call: EVALSHA sha 4 <4 keys> "<token>:<holder>"
		// (acquire.lua's have 3 arguments, leave.lua's a holder id).
		if len(en.Args) == 8 && strings.EqualFold(en.Args[0], "evalsha") && strings.Contains(en.Args[7], ":") {
			relUs = append(relUs, float64(en.Duration.Microseconds()))
		}
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
	s.Notes = append(s.Notes, fmt.Sprintf("%d waiters (one client, default holder ids) queued on one held name; memory: INFO used_memory before they queued and, sampled every 50 ms for two heartbeat periods after, its floor (everything the queue keeps on the server: keys, hash table, list) and its peak (adding the buffers of a heartbeat round: every waiter's heartbeat in one pipeline), and MEMORY USAGE (all elements counted) of the queue's two keys. release: SLOWLOG duration of release.lua (a handover to the head of the queue) in %d releases with the queue full.", n, releases))
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

// waiterProcEnv turns the bench binary into a waiter process of headkill.
const waiterProcEnv = "FENCE_BENCH_WAITER"

// waiterMain is a headkill waiter: it waits for the lock (liveness from
// the environment) until it is killed.
func waiterMain() {
	f := strings.Split(os.Getenv(waiterProcEnv), ",") // addr,name,holder,liveness
	liveness, _ := time.ParseDuration(f[3])
	rdb := redis.NewClient(&redis.Options{Addr: f[0]})
	c, err := fence.New(rdb, fence.WithPrefix("hk:"), fence.WithLiveness(liveness))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	_, err = c.Acquire(context.Background(), f[1], fence.WithHolder(f[2]), fence.WithWaitLimit(time.Hour))
	fmt.Println("acquired", err)
	select {}
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
	s.Notes = append(s.Notes, fmt.Sprintf("%d waiter processes (liveness %v) queue first, one live waiter (another process' client) after them; the %d are SIGKILLed, then the holder releases: time from the kill to the live waiter's Acquire returning.", dead, liveness, dead))
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
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	hash := "hk:{" + name + "}:w"
	for i := range dead {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), waiterProcEnv+"="+strings.Join([]string{e.redis.Addr, name, "dead" + strconv.Itoa(i), liveness.String()}, ","))
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		procs = append(procs, cmd)
		go func() { _, _ = bufio.NewReader(out).ReadString('\n') }()
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
		_ = p.Process.Kill()
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
