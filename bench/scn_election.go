package main

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/fence"
)

// Leader election (issue "scheduled jobs: one leader at a time"): the
// handover between two processes against the fair lock's in the same run
// (and etcd's Election beside them), a SIGKILLed leader's successor, and
// a resignation's fan-out to many observers.

// runElection: resign → the next candidate's Campaign returns, timed as
// handoff2 times a lock's handover (this process leads, a candidate
// process waits, queued), interleaved with the fair lock's handover in
// every repetition.
func runElection(ctx context.Context, e *env, res *results) error {
	libs := []string{"fence", electionName}
	if e.etcd != nil {
		libs = append(libs, etcdElectionName)
	}
	pairs := map[string]*handoffPair{}
	defer func() {
		for _, p := range pairs {
			p.close()
		}
	}()
	for _, lib := range libs {
		p, err := newPair(ctx, e, lib, "election:"+strings.ReplaceAll(lib, " ", "-"))
		if err != nil {
			return fmt.Errorf("%s: %w", lib, err)
		}
		pairs[lib] = p
	}
	h := &handoff2{repMed: map[string][]float64{}, pooled: map[string][]float64{}}
	n, hold := e.cfg.HandoffRounds, e.cfg.HandoffHold
	for rep := 0; rep < e.cfg.Reps; rep++ {
		_, pp, err := interleaved(ctx, 1, 200, []op{e.pingOp()})
		if err != nil {
			return err
		}
		h.add("PING", gapAtOnce, pp["PING"])
		for i := range libs {
			lib := libs[(i+rep)%len(libs)]
			g, err := pairs[lib].run(ctx, e, n, hold)
			if err != nil {
				return fmt.Errorf("%s: %w", lib, err)
			}
			h.add(lib, gapAtOnce, g.atOnce)
			h.add(lib, gapAfterHold, g.afterHold)
			settle()
		}
	}
	s := res.scenario("election")
	for _, row := range append([]string{"PING"}, libs...) {
		for _, m := range []string{gapAtOnce, gapAfterHold} {
			if v, ok := h.repMed[row+"|"+m]; ok {
				s.set(row, m, newFigure("µs", v, h.pooled[row+"|"+m]))
			}
		}
	}
	r := func(a, b, m string) float64 { return pairedRatio(h.repMed[a+"|"+m], h.repMed[b+"|"+m]) }
	s.Ratios["election/fence"] = r(electionName, "fence", gapAtOnce)
	s.Ratios["election/fence after hold"] = r(electionName, "fence", gapAfterHold)
	s.Ratios["election/PING"] = r(electionName, "PING", gapAtOnce)
	if e.etcd != nil {
		s.Ratios["etcd election/election"] = r(etcdElectionName, electionName, gapAtOnce)
		s.Ratios["etcd election/election after hold"] = r(etcdElectionName, electionName, gapAfterHold)
	}
	s.Notes = append(s.Notes, fmt.Sprintf("2 processes: this process leads (fence: Campaign; the lock: Acquire), a candidate process waits, queued (its WaitObserver fired, it is in the queue and subscribed; etcd: its key is under the election's prefix and its watch exists), and the leader resigns (Release; etcd: Resign) at once (%s) or after %v more (%s); gap = from the start of the resignation to the candidate's Campaign returning. The fair lock's handover (fence) is timed the same way in the same repetitions, interleaved. %d handovers per library and variant per repetition.", gapAtOnce, hold, gapAfterHold, n))
	return nil
}

// runLeaderKill: a leader process with term lease LeaderKillLease is
// SIGKILLed while a candidate in this process waits; the time from the
// kill to the candidate's Campaign returning.
func runLeaderKill(ctx context.Context, e *env, res *results) error {
	lease := e.cfg.LeaderKillLease
	var took []float64
	for rep := 0; rep < e.cfg.Reps; rep++ {
		d, err := leaderKillOnce(ctx, e, "lk"+strconv.Itoa(rep), lease)
		if err != nil {
			return err
		}
		took = append(took, d.Seconds())
		logf(e.log, "  leaderkill rep %d: next leader after %v", rep, d)
	}
	s := res.scenario("leaderkill")
	s.set(electionName, "next_leader_s", newFigure("s", took, nil))
	s.Notes = append(s.Notes, fmt.Sprintf("A leader process (its own client, term lease %v) leads; a candidate in the bench process (its own client, the default liveness %v) campaigns and queues; the leader is SIGKILLed: time from the kill to the candidate's Campaign returning. Its term ends at its last renewal plus the lease; the candidate, first in the queue, polls when the lease runs out.", lease, fence.DefaultLiveness))
	return nil
}

func leaderKillOnce(ctx context.Context, e *env, name string, lease time.Duration) (time.Duration, error) {
	r := e.role("leader", electionName)
	r.Name, r.Lease = name, lease
	p, err := startChild(ctx, r)
	if err != nil {
		return 0, err
	}
	defer p.stop()
	if _, err := p.expect(ctx, "leading", 30*time.Second); err != nil {
		return 0, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: e.redis.Addr})
	defer rdb.Close()
	c, err := fence.New(rdb)
	if err != nil {
		return 0, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	el, err := c.Election(name, fence.WithLease(lease))
	if err != nil {
		return 0, err
	}
	type result struct {
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		term, err := el.Campaign(ctx, campaignValue)
		at := time.Now()
		if err == nil {
			_ = term.Release(context.WithoutCancel(ctx))
		}
		got <- result{at, err}
	}()
	if err := waitHLen(ctx, e.ping, "fence:{"+name+"}:w", 1); err != nil {
		return 0, err
	}
	killed := time.Now()
	_ = p.cmd.Process.Kill()
	g := <-got
	if g.err != nil {
		return 0, g.err
	}
	return g.at.Sub(killed), nil
}

// leaderRole: campaign in election r.Name (term lease r.Lease), say
// "leading <token>", and lead until killed or stdin closes.
func leaderRole(r role, in *bufio.Scanner, out *lineWriter) error {
	rdb := redis.NewClient(&redis.Options{Addr: r.Redis})
	defer rdb.Close()
	c, err := fence.New(rdb)
	if err != nil {
		return err
	}
	el, err := c.Election(r.Name, fence.WithLease(r.Lease))
	if err != nil {
		return err
	}
	out.say("ready")
	term, err := el.Campaign(context.Background(), campaignValue)
	if err != nil {
		return err
	}
	out.say("leading %d", term.Token())
	waitForEOF(in)
	return c.Close(context.Background())
}

// runObserve: Observers observers, each on a fence client (and
// connection) of its own, spread over ObserverProcs processes, follow one
// election; this process campaigns, waits until every observer saw the
// term, and resigns with nobody waiting: the latency of the vacancy at
// each observer, from the start of the resignation, against PING.
func runObserve(ctx context.Context, e *env, res *results) error {
	cfg := e.cfg
	per := cfg.Observers / cfg.ObserverProcs
	const name = "observed"
	var procs []*child
	defer func() { stopAll(procs) }()
	for i := range cfg.ObserverProcs {
		r := e.role("observers", electionName)
		r.Name, r.Goroutines = name, per
		p, err := startChild(ctx, r)
		if err != nil {
			return fmt.Errorf("observer process %d: %w", i, err)
		}
		procs = append(procs, p)
	}
	leader, err := newElectionLocker(e.redis.Addr)
	if err != nil {
		return err
	}
	defer leader.Close()
	var pingMed, p50s, p99s []float64
	var pooled, pings []float64
	for rep := 0; rep < cfg.Reps; rep++ {
		_, pp, err := interleaved(ctx, 1, 200, []op{e.pingOp()})
		if err != nil {
			return err
		}
		var lat []float64
		for range cfg.ObserveRounds {
			l, err := observeRound(ctx, leader, procs, name)
			if err != nil {
				return err
			}
			lat = append(lat, l...)
		}
		d := summarize(lat)
		pingMed = append(pingMed, median(pp["PING"]))
		p50s, p99s = append(p50s, d.Median), append(p99s, d.P99)
		pooled, pings = append(pooled, lat...), append(pings, pp["PING"]...)
		logf(e.log, "  observe rep %d: %d observers, vacancy seen p50 %.0f µs, p99 %.0f µs, PING %.0f µs", rep, len(lat)/cfg.ObserveRounds, d.Median, d.P99, median(pp["PING"]))
	}
	s := res.scenario("observe")
	s.set("PING", "latency_us", newFigure("µs", pingMed, pings))
	s.set(electionName, "vacancy_p50_us", newFigure("µs", p50s, pooled))
	s.set(electionName, "vacancy_p99_us", newFigure("µs", p99s, nil))
	s.Ratios["p50/PING"] = pairedRatio(p50s, pingMed)
	s.Ratios["p99/PING"] = pairedRatio(p99s, pingMed)
	s.Notes = append(s.Notes, fmt.Sprintf("%d observers in %d processes (%d each), every one on a fence client and a Redis connection of its own (a subscription each), follow one election; the bench process campaigns, waits until every observer saw the term, then resigns with nobody waiting: latency = from the start of the resignation to each observer's vacancy event, on the real-time clock both processes read. p50 and p99 per repetition over every observer of %d resignations; PING = back-to-back PINGs from the bench process in the same repetition. Observers on one client share one subscription, so this is the costliest way to deploy them.", per*cfg.ObserverProcs, cfg.ObserverProcs, per, cfg.ObserveRounds))
	return nil
}

// observeRound campaigns, waits until every observer process saw the
// term, resigns, and returns each observer's latency of the vacancy (µs).
func observeRound(ctx context.Context, leader *electionLocker, procs []*child, name string) ([]float64, error) {
	h, err := leader.Acquire(ctx, name)
	if err != nil {
		return nil, err
	}
	term := h.(*fence.Lock)
	tok := strconv.FormatInt(term.Token(), 10)
	for _, p := range procs {
		if got, err := p.expect(ctx, "elected", 30*time.Second); err != nil {
			return nil, err
		} else if got != tok {
			return nil, fmt.Errorf("observer process saw term %s, want %s", got, tok)
		}
	}
	t0 := time.Now().UnixNano()
	if err := term.Release(ctx); err != nil {
		return nil, err
	}
	var out []float64
	for _, p := range procs {
		line, err := p.expect(ctx, "seen", 30*time.Second)
		if err != nil {
			return nil, err
		}
		got, times, _ := strings.Cut(line, " ")
		if got != tok {
			return nil, fmt.Errorf("observer process saw the vacancy of term %s, want %s", got, tok)
		}
		ns, err := parseInts(times)
		if err != nil {
			return nil, err
		}
		for _, t := range ns {
			out = append(out, float64(t-t0)/1e3)
		}
	}
	return out, nil
}

// observersRole: r.Goroutines observers of election r.Name, each on a
// client of its own; says "ready" once every one has the election's
// state, "elected <token>" once every one saw a term, and "seen <token>
// <unix ns>..." with the time each saw that term's vacancy.
func observersRole(r role, in *bufio.Scanner, out *lineWriter) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type seen struct {
		ev fence.LeaderEvent
		at int64
	}
	events := make(chan seen, r.Goroutines)
	var clients []*fence.Client
	var rdbs []*redis.Client
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		for _, c := range clients {
			_ = c.Close(context.Background())
		}
		for _, rdb := range rdbs {
			_ = rdb.Close()
		}
	}()
	for range r.Goroutines {
		rdb := redis.NewClient(&redis.Options{Addr: r.Redis, PoolSize: 1})
		rdbs = append(rdbs, rdb)
		c, err := fence.New(rdb)
		if err != nil {
			return err
		}
		clients = append(clients, c)
		el, err := c.Election(r.Name)
		if err != nil {
			return err
		}
		ch, err := el.Observe(ctx)
		if err != nil {
			return err
		}
		if _, ok := <-ch; !ok { // the state: every observer is following
			return fmt.Errorf("observer closed before its first event")
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range ch {
				select {
				case events <- seen{ev, time.Now().UnixNano()}:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	out.say("ready")
	go func() { waitForEOF(in); cancel() }()
	elected := map[int64]int{}
	vacated := map[int64][]string{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-events:
			switch {
			case s.ev.Err != nil || s.ev.Missed:
				return fmt.Errorf("an observer: %v", s.ev)
			case s.ev.Vacant:
				vacated[s.ev.Token] = append(vacated[s.ev.Token], strconv.FormatInt(s.at, 10))
				if len(vacated[s.ev.Token]) == r.Goroutines {
					out.say("seen %d %s", s.ev.Token, strings.Join(vacated[s.ev.Token], " "))
					delete(vacated, s.ev.Token)
				}
			default:
				if elected[s.ev.Token]++; elected[s.ev.Token] == r.Goroutines {
					out.say("elected %d", s.ev.Token)
					delete(elected, s.ev.Token)
				}
			}
		}
	}
}
