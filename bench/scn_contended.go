package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

func runHandoff(ctx context.Context, e *env, res *results) error {
	s := res.scenario("handoff")
	repMed := map[string][]float64{}
	pooled := map[string][]float64{}
	var pingRep []float64
	for rep := 0; rep < e.cfg.Reps; rep++ {
		// A PING block per repetition, so the ratio to PING is paired.
		pm, _, err := interleaved(ctx, 1, 200, []op{e.pingOp()})
		if err != nil {
			return err
		}
		pingRep = append(pingRep, pm["PING"][0])
		for _, l := range rotated(e.waitLibs(), rep) {
			gaps, err := handoffOnce(ctx, l, e.cfg.HandoffRounds, e.cfg.HandoffHold)
			if err != nil {
				return fmt.Errorf("%s: %w", l.Name(), err)
			}
			repMed[l.Name()] = append(repMed[l.Name()], median(gaps))
			pooled[l.Name()] = append(pooled[l.Name()], gaps...)
			settle()
		}
	}
	s.set("PING", "gap_us", newFigure("µs", pingRep, nil))
	for _, l := range e.waitLibs() {
		s.set(l.Name(), "gap_us", newFigure("µs", repMed[l.Name()], pooled[l.Name()]))
	}
	s.Ratios["fence/PING"] = pairedRatio(repMed["fence"], pingRep)
	best := bestPeerPerRep(repMed, e.peerNames(), true)
	s.Ratios["best_peer/fence"] = pairedRatio(best, repMed["fence"])
	s.Notes = append(s.Notes, fmt.Sprintf("2 goroutines, one name: the holder holds %v and releases while the other is already waiting in Acquire; gap = from the start of Release to the return of the waiter's Acquire. %d handoffs per library per repetition. The PING row is the PING median of each repetition.", e.cfg.HandoffHold, e.cfg.HandoffRounds))
	return nil
}

// handoffOnce ping-pongs one lock between two goroutines and returns the
// handoff gaps in µs.
func handoffOnce(ctx context.Context, l locker, rounds int, hold time.Duration) ([]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var (
		mu        sync.Mutex
		gaps      []float64
		relStart  atomic.Int64
		errs      errOnce
		wg        sync.WaitGroup
		done      = make(chan struct{})
		closeOnce sync.Once
		turn      = [2]chan struct{}{make(chan struct{}, 1), make(chan struct{}, 1)}
	)
	finish := func() { closeOnce.Do(func() { close(done) }) }
	key := "handoff"
	side := func(i int, first bool) {
		defer wg.Done()
		var h held
		var err error
		if first {
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
			// Holding: let the other side start waiting, hold, release.
			turn[1-i] <- struct{}{}
			select {
			case <-time.After(hold):
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
	go side(0, true)
	go side(1, false)
	wg.Wait()
	return gaps, errs.get()
}

type contendedRep struct {
	acqPerS   float64
	gaps      []float64
	waits     []float64
	minMax    float64
	cmdsAcq   float64
	reqsAcq   float64
	failures  int64
	perWorker []int64
	stats     serverCmds
}

func runContended(ctx context.Context, e *env, res *results) error {
	s := res.scenario("contended")
	type agg struct {
		acq, gapMed, waitP99, minMax, cmds, reqs, fails []float64
		gaps, waits                                     []float64
		by                                              []map[string]int64
	}
	a := map[string]*agg{}
	for _, l := range e.waitLibs() {
		a[l.Name()] = &agg{}
	}
	for rep := 0; rep < e.cfg.Reps; rep++ {
		for _, l := range rotated(e.waitLibs(), rep) {
			r, err := contendedOnce(ctx, e, l)
			if err != nil {
				return fmt.Errorf("%s: %w", l.Name(), err)
			}
			g := a[l.Name()]
			g.acq = append(g.acq, r.acqPerS)
			g.gapMed = append(g.gapMed, median(r.gaps))
			g.waitP99 = append(g.waitP99, summarize(r.waits).P99)
			g.minMax = append(g.minMax, r.minMax)
			g.cmds = append(g.cmds, r.cmdsAcq)
			g.reqs = append(g.reqs, r.reqsAcq)
			g.fails = append(g.fails, float64(r.failures))
			g.gaps = append(g.gaps, r.gaps...)
			g.waits = append(g.waits, r.waits...)
			g.by = append(g.by, r.stats.By)
			logf(e.log, "  contended %s rep %d: %.0f acq/s, per-goroutine %v, %.1f cmds/acq", l.Name(), rep, r.acqPerS, r.perWorker, r.cmdsAcq)
			settle()
		}
	}
	for _, l := range e.waitLibs() {
		g := a[l.Name()]
		n := l.Name()
		s.set(n, "acq_per_s", newFigure("acquisitions/s", g.acq, nil))
		s.set(n, "gap_us", newFigure("µs", g.gapMed, g.gaps))
		s.set(n, "wait_p99_ms", newFigure("ms", scale(g.waitP99, 1e-3), nil))
		s.set(n, "min_max", newFigure("ratio", g.minMax, nil))
		s.set(n, "cmds_per_acq", newFigure("server commands/acquisition", g.cmds, nil))
		s.set(n, "reqs_per_acq", newFigure("client commands/acquisition", g.reqs, nil))
		s.set(n, "failed_acquires", newFigure("count/repetition", g.fails, nil))
		s.Extra["commandstats_"+n] = g.by
	}
	peers := e.peerNames()
	acq := map[string][]float64{}
	cmds := map[string][]float64{}
	wait := map[string][]float64{}
	for _, l := range e.waitLibs() {
		acq[l.Name()] = a[l.Name()].acq
		cmds[l.Name()] = a[l.Name()].cmds
		wait[l.Name()] = a[l.Name()].waitP99
	}
	s.Ratios["acq_per_s fence/best_peer"] = pairedRatio(acq["fence"], bestPeerPerRep(acq, peers, false))
	s.Ratios["cmds_per_acq fence/best_peer"] = pairedRatio(cmds["fence"], bestPeerPerRep(cmds, peers, true))
	s.Ratios["wait_p99 fence/best_peer"] = pairedRatio(wait["fence"], bestPeerPerRep(wait, peers, true))
	s.Notes = append(s.Notes,
		fmt.Sprintf("%d goroutines on one name, hold %v, %v per library per repetition; a goroutine re-enters Acquire right after it releases.", e.cfg.ContendedWorkers, e.cfg.ContendedHold, e.cfg.ContendedDur),
		"cmds_per_acq: INFO commandstats delta (every command the server executed, those inside Lua scripts included) / acquisitions. reqs_per_acq: commands the library's go-redis client sent (hook; pipelined ones counted singly) plus (un)subscribe commands, / acquisitions.",
		"gap: from the start of a Release to the return of the next Acquire of a goroutine that was already waiting. wait: from calling Acquire to its return. min_max: fewest / most acquisitions of one goroutine in the repetition.",
		"failed_acquires: Acquire calls that gave up before the end of the window (redsync after its 32 tries); the goroutine then calls Acquire again.")
	return nil
}

func scale(xs []float64, k float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x * k
	}
	return out
}

func contendedOnce(ctx context.Context, e *env, l locker) (*contendedRep, error) {
	cfg := e.cfg
	key := "contended"
	// One acquisition before the window: the scripts loaded, the
	// connections (and a cluster's slot map) in place, so that a short
	// window on a loaded machine is not spent on them.
	h, err := l.Acquire(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	if err := h.Release(ctx); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	before, err := commandStats(ctx, e.ping)
	if err != nil {
		return nil, err
	}
	c0 := l.Counter().snapshot()
	start := time.Now()
	stop := start.Add(cfg.ContendedDur)
	runCtx, cancel := context.WithDeadline(ctx, stop)
	defer cancel()

	var (
		relStart atomic.Int64
		mu       sync.Mutex
		gaps     []float64
		waits    []float64
		failures atomic.Int64
		counts   = make([]int64, cfg.ContendedWorkers)
		errs     errOnce
		wg       sync.WaitGroup
	)
	for w := 0; w < cfg.ContendedWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for {
				waitStart := time.Now()
				if !waitStart.Before(stop) {
					return
				}
				h, err := l.Acquire(runCtx, key)
				t1 := time.Now()
				if err != nil {
					if !t1.Before(stop) || runCtx.Err() != nil {
						return
					}
					failures.Add(1)
					continue
				}
				if !t1.Before(stop) {
					_ = h.Release(context.WithoutCancel(ctx))
					return
				}
				counts[w]++
				rs := relStart.Load()
				mu.Lock()
				if rs > waitStart.UnixNano() {
					gaps = append(gaps, float64(t1.UnixNano()-rs)/1e3)
				}
				waits = append(waits, us(t1.Sub(waitStart)))
				mu.Unlock()
				time.Sleep(cfg.ContendedHold)
				relStart.Store(time.Now().UnixNano())
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				err = h.Release(rctx)
				rcancel()
				if err != nil {
					errs.set(fmt.Errorf("release: %w", err))
					return
				}
			}
		}(w)
	}
	wg.Wait()
	elapsed := cfg.ContendedDur.Seconds()
	if err := errs.get(); err != nil {
		return nil, err
	}
	after, err := commandStats(ctx, e.ping)
	if err != nil {
		return nil, err
	}
	d := diffStats(before, after)
	c := l.Counter().snapshot().sub(c0)
	var total int64
	mn, mx := int64(math.MaxInt64), int64(0)
	for _, n := range counts {
		total += n
		mn, mx = min(mn, n), max(mx, n)
	}
	if total == 0 {
		return nil, errors.New("no acquisition in the window")
	}
	r := &contendedRep{
		acqPerS: float64(total) / elapsed, gaps: gaps, waits: waits,
		cmdsAcq:   float64(d.Total) / float64(total),
		reqsAcq:   float64(c.cmds+d.PubSub) / float64(total),
		failures:  failures.Load(),
		perWorker: slices.Clone(counts),
		stats:     d,
	}
	if mx > 0 {
		r.minMax = float64(mn) / float64(mx)
	}
	return r, nil
}
