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

// The observe scenario's rows: fence's observers each on a client of
// their own (the goal's), one client per process (observers sharing its
// subscription), and the floor: a go-redis subscriber per connection
// receiving a PUBLISH, in the same processes.
const (
	obsOwn    = "fence Observe, a client each"
	obsShared = "fence Observe, one client per process"
	obsFloor  = "PUBLISH → a go-redis subscriber each"
)

// runObserve: Observers observers, spread over ObserverProcs processes,
// follow one election; this process campaigns, waits until every
// observer saw the term, and resigns with nobody waiting: the latency of
// the vacancy at each observer, from the start of the resignation,
// against PING and against the floor of a PUBLISH to as many subscribers.
func runObserve(ctx context.Context, e *env, res *results) error {
	cfg := e.cfg
	per := cfg.Observers / cfg.ObserverProcs
	groups := map[string][]*child{}
	defer func() {
		for _, g := range groups {
			stopAll(g)
		}
	}()
	for j, row := range []string{obsOwn, obsShared, obsFloor} {
		for i := range cfg.ObserverProcs {
			r := e.role("observers", electionName)
			r.Name, r.Goroutines = "observed:"+strconv.Itoa(j), per
			switch row {
			case obsShared:
				r.Shared = true
			case obsFloor:
				r.Kind, r.Name = "subscribers", observeFloorChannel
			}
			p, err := startChild(ctx, r)
			if err != nil {
				return fmt.Errorf("%s, process %d: %w", row, i, err)
			}
			groups[row] = append(groups[row], p)
		}
	}
	leader, err := newElectionLocker(e.redis.Addr)
	if err != nil {
		return err
	}
	defer leader.Close()
	o := &observeFigures{p50: map[string][]float64{}, p99: map[string][]float64{}, pooled: map[string][]float64{}}
	for rep := 0; rep < cfg.Reps; rep++ {
		_, pp, err := interleaved(ctx, 1, 200, []op{e.pingOp()})
		if err != nil {
			return err
		}
		o.add("PING", pp["PING"])
		for i, row := range []string{obsOwn, obsShared, obsFloor} {
			lat, err := observeRows(ctx, e, leader, groups[row], "observed:"+strconv.Itoa(i), cfg.ObserveRounds)
			if err != nil {
				return fmt.Errorf("%s: %w", row, err)
			}
			o.add(row, lat)
			d := summarize(lat)
			logf(e.log, "  observe rep %d, %s: %d observers, seen p50 %.0f µs, p99 %.0f µs, PING %.0f µs", rep, row, len(lat)/cfg.ObserveRounds, d.Median, d.P99, median(pp["PING"]))
		}
	}
	o.report(res.scenario("observe"), per, cfg)
	return nil
}

const observeFloorChannel = "bench:observe-floor"

// observeRows runs rounds of one row: resignations seen by fence's
// observers (name), or PUBLISHes seen by the floor's subscribers.
func observeRows(ctx context.Context, e *env, leader *electionLocker, procs []*child, name string, rounds int) ([]float64, error) {
	var lat []float64
	for range rounds {
		var l []float64
		var err error
		if strings.HasPrefix(procs[0].kind, "subscribers") {
			l, err = publishRound(ctx, e, procs)
		} else {
			l, err = observeRound(ctx, leader, procs, name)
		}
		if err != nil {
			return nil, err
		}
		lat = append(lat, l...)
	}
	return lat, nil
}

// observeFigures collects the scenario's latencies per row: the median
// and p99 of each repetition, and every sample.
type observeFigures struct {
	p50, p99, pooled map[string][]float64
}

func (o *observeFigures) add(row string, lat []float64) {
	d := summarize(lat)
	o.p50[row], o.p99[row] = append(o.p50[row], d.Median), append(o.p99[row], d.P99)
	o.pooled[row] = append(o.pooled[row], lat...)
}

func (o *observeFigures) report(s *scenario, per int, cfg config) {
	for _, row := range []string{"PING", obsOwn, obsShared, obsFloor} {
		s.set(row, "p50_us", newFigure("µs", o.p50[row], o.pooled[row]))
		s.set(row, "p99_us", newFigure("µs", o.p99[row], nil))
	}
	ping := o.p50["PING"]
	for _, v := range []struct{ key, row string }{{"", obsOwn}, {"shared ", obsShared}, {"floor ", obsFloor}} {
		s.Ratios[v.key+"p50/PING"] = pairedRatio(o.p50[v.row], ping)
		s.Ratios[v.key+"p99/PING"] = pairedRatio(o.p99[v.row], ping)
	}
	s.Ratios["p50/floor p50"] = pairedRatio(o.p50[obsOwn], o.p50[obsFloor])
	s.Ratios["p99/floor p99"] = pairedRatio(o.p99[obsOwn], o.p99[obsFloor])
	s.Notes = append(s.Notes, fmt.Sprintf("%d observers in %d processes (%d each) follow one election (%s: each on a fence client and a Redis connection of its own, a subscription each; %s: one fence client per process, its observers sharing its subscription); the bench process campaigns, waits until every observer saw the term, then resigns with nobody waiting: latency = from the start of the resignation to each observer's vacancy event, on the real-time clock every process reads. %s: as many go-redis subscribers (one connection each) in as many processes receiving one PUBLISH from the bench, from its start: the floor of any fan-out through Redis on this machine, where every observer process shares one CPU. p50 and p99 per repetition over every observer of %d rounds; PING = back-to-back PINGs from the bench process in the same repetition.", per*cfg.ObserverProcs, cfg.ObserverProcs, per, obsOwn, obsShared, obsFloor, cfg.ObserveRounds))
}

// publishRound publishes once to the floor's subscribers and returns
// each one's latency (µs).
func publishRound(ctx context.Context, e *env, procs []*child) ([]float64, error) {
	if err := e.ping.Ping(ctx).Err(); err != nil {
		return nil, err
	}
	t0 := time.Now().UnixNano()
	if err := e.ping.Publish(ctx, observeFloorChannel, "x").Err(); err != nil {
		return nil, err
	}
	return collectSeen(ctx, procs, "0", t0)
}

// collectSeen reads each process' "seen <token> <unix ns>..." and
// returns the latencies from t0 (µs).
func collectSeen(ctx context.Context, procs []*child, tok string, t0 int64) ([]float64, error) {
	var out []float64
	for _, p := range procs {
		line, err := p.expect(ctx, "seen", 30*time.Second)
		if err != nil {
			return nil, err
		}
		got, times, _ := strings.Cut(line, " ")
		if got != tok {
			return nil, fmt.Errorf("%s process saw %s, want %s", p.kind, got, tok)
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
	return collectSeen(ctx, procs, tok, t0)
}

// observersRole: r.Goroutines observers of election r.Name, each on a
// client of its own (r.Shared: all on one client); says "ready" once
// every one has the election's state, "elected <token>" once every one
// saw a term, and "seen <token> <unix ns>..." with the time each saw that
// term's vacancy.
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
	var c *fence.Client
	for range r.Goroutines {
		if c == nil || !r.Shared {
			rdb := redis.NewClient(&redis.Options{Addr: r.Redis, PoolSize: 1})
			rdbs = append(rdbs, rdb)
			var err error
			if c, err = fence.New(rdb); err != nil {
				return err
			}
			clients = append(clients, c)
		}
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

// subscribersRole: r.Goroutines go-redis subscribers of channel r.Name,
// each on a connection of its own; says "ready" once every one is
// subscribed, and "seen 0 <unix ns>..." with the time each received a
// message, once all did.
func subscribersRole(r role, in *bufio.Scanner, out *lineWriter) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	times := make(chan int64, r.Goroutines)
	var subs []*redis.PubSub
	var rdbs []*redis.Client
	var wg sync.WaitGroup
	defer func() {
		cancel()
		for _, ps := range subs {
			_ = ps.Close()
		}
		wg.Wait()
		for _, rdb := range rdbs {
			_ = rdb.Close()
		}
	}()
	for range r.Goroutines {
		rdb := redis.NewClient(&redis.Options{Addr: r.Redis, PoolSize: 1})
		rdbs = append(rdbs, rdb)
		ps := rdb.Subscribe(ctx, r.Name)
		if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
			return fmt.Errorf("subscribe: %w", err)
		}
		subs = append(subs, ps)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := ps.ReceiveMessage(ctx); err != nil {
					return
				}
				select {
				case times <- time.Now().UnixNano():
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	out.say("ready")
	go func() { waitForEOF(in); cancel() }()
	var got []string
	for {
		select {
		case <-ctx.Done():
			return nil
		case t := <-times:
			if got = append(got, strconv.FormatInt(t, 10)); len(got) == r.Goroutines {
				out.say("seen 0 %s", strings.Join(got, " "))
				got = nil
			}
		}
	}
}
