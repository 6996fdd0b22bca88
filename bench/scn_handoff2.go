package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The handover between two processes (issue "a fair lock across
// processes": "handoff (2 processes) median ≤ 2× PING"): the holder is
// this process, the waiter another process, already queued when the
// release starts; the gap runs from the start of Release to the waiter's
// Acquire returning, both read on the system's real-time clock, which the
// two processes share. The floor of any handover a message carries is
// measured the same way: a PUBLISH from this process to a subscriber in
// another.

// handoff2Libs are the libraries of handoff2: fence and, when the run has
// an etcd server, etcd. The polling peers' handover is their retry delay,
// which handoff shows.
func (e *env) handoff2Libs() []string {
	libs := []string{"fence"}
	if e.etcd != nil {
		libs = append(libs, etcdName)
	}
	return libs
}

// role is a child role with this run's servers.
func (e *env) role(kind, lib string) role {
	r := role{Kind: kind, Lib: lib, Redis: e.redis.Addr}
	if e.etcd != nil {
		r.Etcd = e.etcd.Endpoint
	}
	return r
}

const (
	floorName       = "PUBLISH → subscriber"
	scriptFloorName = "release.lua handing over → subscriber"
	noTokenName     = "release.lua -token"
	noLivenessName  = "release.lua -token -liveness"
	noTimeName      = "release.lua -token -liveness -time"
	bareName        = "a bare handover script"
	compactName     = "release.lua's commands, compact"
	etcdWatchRev    = "etcd watch from the Get's revision"
	etcdWatchNxt    = "etcd watch from the next revision"
	gapAtOnce       = "gap_us"
	gapAfterHold    = "gap_after_hold_us"
	// The floors' Redis time per message (INFO commandstats): PUBLISH's,
	// or release.lua's, inner commands included.
	redisAtOnce    = "redis_us"
	redisAfterHold = "redis_after_hold_us"
)

func runHandoff2(ctx context.Context, e *env, res *results) error {
	h, err := startHandoff2(ctx, e)
	if err != nil {
		return err
	}
	defer h.close()
	for rep := 0; rep < e.cfg.Reps; rep++ {
		if err := h.rep(ctx, e, rep); err != nil {
			return err
		}
	}
	// fence has handed over by now: Redis must have the script floor's
	// release.lua by SHA1, or the bench composed something else.
	have, err := e.ping.ScriptExists(ctx, h.release.Hash()).Result()
	if err != nil {
		return err
	}
	if !have[0] {
		return fmt.Errorf("handoff2: Redis has no script of the composed release.lua after fence handed over: the bench composes it unlike fence/scripts.go; update fenceScriptSources")
	}
	h.report(e, res.scenario("handoff2"))
	return nil
}

// handoff2 is the scenario's processes, which live through every
// repetition as deployed processes do, and its samples.
type handoff2 struct {
	libs     []string
	sub      *child                  // the floors' subscriber
	release  *redis.Script           // fence's release.lua, for the script floor
	steps    []*redis.Script         // the script of each step of handoverSteps
	pairs    map[string]*handoffPair // per library
	watchers [2]*child               // etcd's bare watch: from the Get's revision, from the next
	repMed   map[string][]float64    // "<row>|<metric>": per repetition
	pooled   map[string][]float64
	// etcd handoffs, and those whose waiter's watch was unsynced at the
	// release.
	seen, slow int
}

func startHandoff2(ctx context.Context, e *env) (_ *handoff2, err error) {
	h := &handoff2{libs: e.handoff2Libs(), pairs: map[string]*handoffPair{}, repMed: map[string][]float64{}, pooled: map[string][]float64{}}
	defer func() {
		if err != nil {
			h.close()
		}
	}()
	if h.sub, err = startSubscriber(ctx, e); err != nil {
		return nil, fmt.Errorf("PUBLISH floor: %w", err)
	}
	_, rel, err := fenceScriptSources()
	if err != nil {
		return nil, err
	}
	h.release = redis.NewScript(rel)
	for _, st := range handoverSteps {
		if st.src != "" {
			h.steps = append(h.steps, redis.NewScript(st.src))
			continue
		}
		if err := applyEdits(&rel, st.edits, st.row); err != nil {
			return nil, err
		}
		h.steps = append(h.steps, redis.NewScript(rel))
	}
	for _, lib := range h.libs {
		p, err := newHandoffPair(ctx, e, lib)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", lib, err)
		}
		h.pairs[lib] = p
	}
	if e.etcd != nil {
		for i := range h.watchers {
			r := e.role("etcdwatch", etcdName)
			r.Name = etcdPrefix + "watch-probe"
			if h.watchers[i], err = startChild(ctx, r); err != nil {
				return nil, fmt.Errorf("etcd watch: %w", err)
			}
		}
	}
	return h, nil
}

func (h *handoff2) close() {
	if h.sub != nil {
		h.sub.stop()
	}
	for _, p := range h.pairs {
		p.close()
	}
	for _, w := range h.watchers {
		if w != nil {
			w.stop()
		}
	}
}

func (h *handoff2) add(row, metric string, gaps []float64) {
	k := row + "|" + metric
	h.repMed[k] = append(h.repMed[k], median(gaps))
	h.pooled[k] = append(h.pooled[k], gaps...)
}

// rep measures one repetition: the PINGs, the floor, each library's
// handoffs (order rotated) and etcd's bare watch.
func (h *handoff2) rep(ctx context.Context, e *env, rep int) error {
	n, hold := e.cfg.HandoffRounds, e.cfg.HandoffHold
	_, pp, err := interleaved(ctx, 1, 200, []op{e.pingOp()})
	if err != nil {
		return err
	}
	h.add("PING", gapAtOnce, pp["PING"])
	idle, err := idlePings(ctx, e.ping, n, hold)
	if err != nil {
		return err
	}
	h.add("PING", gapAfterHold, idle)
	type floor struct {
		row, cmd string // the row, and the command whose Redis time it reports
		run      func(ctx context.Context, e *env, sub *child, rounds int, wait time.Duration) ([]float64, error)
	}
	floors := []floor{{floorName, "publish", publishFloor}, {scriptFloorName, "evalsha", scriptFloor(h.release)}}
	for i, st := range handoverSteps {
		floors = append(floors, floor{st.row, "evalsha", scriptFloor(h.steps[i])})
	}
	for _, f := range floors {
		for _, v := range []struct {
			gap, redis string
			wait       time.Duration
		}{{gapAtOnce, redisAtOnce, 0}, {gapAfterHold, redisAfterHold, hold}} {
			before, err := commandTimes(ctx, e.ping)
			if err != nil {
				return err
			}
			gaps, err := f.run(ctx, e, h.sub, n, v.wait)
			if err != nil {
				return fmt.Errorf("%s: %w", f.row, err)
			}
			after, err := commandTimes(ctx, e.ping)
			if err != nil {
				return err
			}
			b, a := before[f.cmd], after[f.cmd]
			if a.calls-b.calls != int64(n) {
				return fmt.Errorf("%s: INFO commandstats counts %d %s calls, not the %d sent", f.row, a.calls-b.calls, f.cmd, n)
			}
			h.add(f.row, v.gap, gaps)
			h.add(f.row, v.redis, []float64{float64(a.usec-b.usec) / float64(n)})
		}
	}
	for i := range h.libs {
		lib := h.libs[(i+rep)%len(h.libs)]
		g, err := h.pairs[lib].run(ctx, e, n, hold)
		if err != nil {
			return fmt.Errorf("%s: %w", lib, err)
		}
		h.add(lib, gapAtOnce, g.atOnce)
		h.add(lib, gapAfterHold, g.afterHold)
		h.slow += g.slowWatchers
		h.seen += g.etcdRounds
		settle()
	}
	if e.etcd == nil {
		return nil
	}
	for i, row := range []string{etcdWatchRev, etcdWatchNxt} {
		gaps, err := etcdWatchProbe(ctx, e, h.watchers[i], i == 1, n)
		if err != nil {
			return fmt.Errorf("etcd watch: %w", err)
		}
		h.add(row, gapAtOnce, gaps)
	}
	return nil
}

// report sets the scenario's figures, ratios and notes.
func (h *handoff2) report(e *env, s *scenario) {
	n, hold := e.cfg.HandoffRounds, e.cfg.HandoffHold
	libs, repMed, pooled, slow, seen := h.libs, h.repMed, h.pooled, h.slow, h.seen
	rows := []string{"PING", floorName, scriptFloorName}
	for _, st := range handoverSteps {
		rows = append(rows, st.row)
	}
	rows = append(rows, libs...)
	if e.etcd != nil {
		rows = append(rows, etcdWatchRev, etcdWatchNxt)
	}
	for _, row := range rows {
		for _, m := range []string{gapAtOnce, gapAfterHold, redisAtOnce, redisAfterHold} {
			if v, ok := repMed[row+"|"+m]; ok {
				s.set(row, m, newFigure("µs", v, pooled[row+"|"+m]))
			}
		}
	}
	r := func(a, b, m string) float64 { return pairedRatio(repMed[a+"|"+m], repMed[b+"|"+m]) }
	for _, v := range []struct{ suffix, m string }{{"", gapAtOnce}, {" after hold", gapAfterHold}} {
		s.Ratios["fence/PING"+v.suffix] = r("fence", "PING", v.m)
		s.Ratios["floor/PING"+v.suffix] = r(floorName, "PING", v.m)
		s.Ratios["fence/floor"+v.suffix] = r("fence", floorName, v.m)
		s.Ratios["script floor/floor"+v.suffix] = r(scriptFloorName, floorName, v.m)
		s.Ratios["fence/script floor"+v.suffix] = r("fence", scriptFloorName, v.m)
		for _, st := range handoverSteps {
			s.Ratios[st.row+"/floor"+v.suffix] = r(st.row, floorName, v.m)
		}
		if e.etcd != nil {
			s.Ratios[etcdName+"/fence"+v.suffix] = r(etcdName, "fence", v.m)
		}
	}
	if e.etcd != nil {
		s.Extra["etcd_rounds_waiter_watch_unsynced"] = slow
		s.Extra["etcd_rounds"] = seen
	}
	s.Notes = append(s.Notes,
		fmt.Sprintf("2 processes, one name: this process holds the lock, a waiter process (its own go-redis and lock client, or etcd client) calls Acquire; once the waiter is queued (fence: its WaitObserver fired, it is in the name's queue and subscribed; etcd: its key is under the mutex's prefix and its watch exists on the server) the holder releases, at once (%s) or after %v more (%s); gap = from the start of Release to the waiter's Acquire returning, on the real-time clock both processes read. %d handoffs per library and variant per repetition.", gapAtOnce, hold, gapAfterHold, n),
		fmt.Sprintf("PING: %s = back-to-back PINGs (hot), %s = one PING after %v without traffic (the same idle as the held lock). %s: the floor of any handover a message carries: a PUBLISH from this process, received by a go-redis subscriber in another process (ReceiveMessage), from the start of PUBLISH to its receipt, after a PING (%s) or after %v idle (%s).", gapAtOnce, gapAfterHold, hold, floorName, gapAtOnce, hold, gapAfterHold),
		fmt.Sprintf("%s: the floor of fence's handover, the PUBLISH floor plus what Redis does to hand over: this process makes a held lock with one live waiter in its queue (SET, RPUSH, HSET), then runs fence's release.lua (composed as fence/scripts.go composes it, checked by SHA1 against what fence loaded) by EVALSHA from a bare go-redis client; it hands the lock to the waiter, issues its token and publishes the grant to the same subscriber process; timed as the PUBLISH floor. No fence client code runs on either side, so fence ÷ this row is what fence's client adds to a handover, and this row ÷ the PUBLISH floor what the script adds: the token rule (TIME, the counter's SET … GET), the queue's pop (LPOP, HGET, HDEL), the lock's SET, in one call. %s and %s: the Redis time per call of the floor's command (PUBLISH; EVALSHA of release.lua, its inner commands included), from INFO commandstats read before and after each variant's %d calls.", scriptFloorName, redisAtOnce, redisAfterHold, n))
	var labels []string
	for _, st := range handoverSteps {
		labels = append(labels, st.row+": "+st.label)
	}
	s.Notes = append(s.Notes, fmt.Sprintf("Each guarantee of the handover in Redis: the script floor again with one part of release.lua taken out at a time, cumulatively, then with two scripts of the bench's own, each timed and counted the same way (%s). Their Redis time per call against release.lua's is what each part costs the server; the bare script is the least a handover through a queue and a message does in a script, and the compact one what release.lua's commands cost without its shape.", strings.Join(labels, "; ")))
	if e.etcd != nil {
		s.Notes = append(s.Notes, fmt.Sprintf("etcd: concurrency.Mutex (client go.etcd.io/etcd/client/v3, server %s, one session per locker). Its waiter watches its predecessor's key from the revision its Get read: such a watch starts unsynced, and etcd delivers an unsynced watcher's events only when its sync loop runs (every 100 ms). The two etcd watch rows time a bare watch the same way (a child watches a key, this process deletes it at once): from the Get's revision, as the Mutex does, and from the next revision. In this run the waiter's watch was unsynced when the holder released in %d of %d etcd handoffs (etcd_debugging_mvcc_slow_watcher_total ≥ 1 at the release).", e.etcdVersion(), slow, seen))
	}
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

const floorChannel = "bench:floor"

// scriptFloorKeys are the script floor's lock, counter, queue and
// waiters; the lock's channel (its key and ":ch") is the subscriber's
// second channel.
var scriptFloorKeys = []string{floorChannel, floorChannel + ":n", floorChannel + ":q", floorChannel + ":w"}

// handoverSteps take one part of a handover out of the script floor's
// release.lua at a time, cumulatively (as shapeSteps do for the
// uncontended path), so that the Redis time of each row says what each
// guarantee of a handover costs. What is left after the third step is
// what any lock that hands over through a queue and a message needs: the
// ownership check (GET), the queue's pop (LPOP), the lock's SET and the
// PUBLISH. The last two steps are scripts of their own: those four
// commands written plainly, and every command of release.lua's handover
// written in one piece, so that what release.lua's shape costs beyond its
// commands shows too.
var handoverSteps = []struct {
	row, label string
	edits      []shapeEdit
	src        string // a script of its own instead of edits
}{
	{row: noTokenName, label: "without the token rule: the new holder's value without a token from the counter and the clock (no SET … GET of the counter)",
		edits: []shapeEdit{{release: true, old: "local v = next_token() .. ':' .. id\n", repl: "local v = '1:' .. id\n"}}},
	{row: noLivenessName, label: "and without the waiter's liveness: the head is granted without reading and deleting its place (no HGET, HDEL)",
		edits: []shapeEdit{{release: true, old: "local lease = live(id)\n      if lease then\n        redis.call('HDEL', KEYS[4], id)\n", repl: "local lease = '5000'\n      if lease then\n"}}},
	{row: noTimeName, label: "and without the grant's server time, from which the new holder dates its lease (no TIME)",
		edits: []shapeEdit{{release: true, old: "local _, at = now()\n", repl: "local at = '0'\n"}}},
	{row: bareName, label: "not release.lua but the same four commands written plainly, with no function defined: the least any script that hands over through a queue and a message runs",
		src: bareHandoverLua},
	{row: compactName, label: "not release.lua but every command its handover makes (the token rule, the liveness, the grant's time included), written in one piece, with no function defined: what release.lua's shape (queue.lua's functions, made per call) costs beyond its commands",
		src: compactHandoverLua},
}

// stepName is a row of handoverSteps as the goals' note and the results
// table name it: an edit of release.lua by its edits alone ("-token").
func stepName(row string) string {
	if strings.HasPrefix(row, "release.lua -") {
		return strings.TrimPrefix(row, "release.lua ")
	}
	return row
}

// compactHandoverLua makes the commands of release.lua's handover to a
// live head — GET, LPOP, HGET, HDEL, TIME, the counter's SET … GET, SET,
// PUBLISH — in the same order and with the same token rule, written in
// one piece. It serves only the script floor's case (a held lock, one
// live waiter); release.lua is the one that serves every case.
const compactHandoverLua = `if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local id = redis.call('LPOP', KEYS[3])
local w = redis.call('HGET', KEYS[4], id)
local i = string.find(w, ':', 1, true)
local tm = redis.call('TIME')
local t = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local s = tm[1] .. string.sub('00000' .. tm[2], -6)
if tonumber(string.sub(w, 1, i - 1)) * 1000 <= t then
  return redis.error_reply('the script floor\'s waiter is not live')
end
redis.call('HDEL', KEYS[4], id)
local at = s
local old = redis.call('SET', KEYS[2], s, 'PX', '2592000000', 'GET')
if old and tonumber(old) >= t then
  s = string.format('%.0f', tonumber(old) + 1)
  redis.call('SET', KEYS[2], s, 'PX', '2592000000')
end
local v = s .. ':' .. id
redis.call('SET', KEYS[1], v, 'PX', string.sub(w, i + 1))
redis.pcall('PUBLISH', KEYS[1] .. ':ch', 'grant:' .. at .. ':' .. v)
return {3, v}`

// bareHandoverLua makes the commands that handoverSteps' third step
// leaves of release.lua, in as little Lua as they can be written: the
// ownership check, the queue's pop, the lock's SET and the PUBLISH,
// answering as release.lua does.
const bareHandoverLua = `if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local v = '1:' .. redis.call('LPOP', KEYS[3])
redis.call('SET', KEYS[1], v, 'PX', 5000)
redis.call('PUBLISH', KEYS[1] .. ':ch', 'grant:0:' .. v)
return {3, v}`

// scriptFloor times script — fence's release.lua, or a step of
// handoverSteps — handing a lock over to a waiter that is only an entry
// in the queue, from this process (a bare go-redis client, by EVALSHA) to
// the subscriber process (see the scenario's notes), as toSubscriber
// times.
func scriptFloor(script *redis.Script) func(ctx context.Context, e *env, sub *child, rounds int, wait time.Duration) ([]float64, error) {
	return func(ctx context.Context, e *env, sub *child, rounds int, wait time.Duration) ([]float64, error) {
		const holder, waiter = "1:bench-holder", "bench-waiter"
		k := scriptFloorKeys
		defer e.ping.Del(context.WithoutCancel(ctx), k...)
		if err := script.Load(ctx, e.ping).Err(); err != nil {
			return nil, err
		}
		// The waiter's deadline (server ms) is an hour away: always live.
		place := fmt.Sprintf("%d:5000", time.Now().Add(time.Hour).UnixMilli())
		held := func() error {
			_, err := e.ping.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, k[0], holder, 0)
				p.Del(ctx, k[2], k[3])
				p.RPush(ctx, k[2], waiter)
				p.HSet(ctx, k[3], waiter, place)
				return nil
			})
			return err
		}
		return toSubscriber(ctx, e, sub, rounds, wait, held, func() error {
			rep, err := script.EvalSha(ctx, e.ping, k, holder).Slice()
			if err == nil && (len(rep) < 2 || rep[0] != int64(3)) {
				err = fmt.Errorf("the script did not hand over: %v", rep)
			}
			return err
		})
	}
}

func startSubscriber(ctx context.Context, e *env) (*child, error) {
	r := e.role("subscriber", "")
	r.Name = floorChannel
	return startChild(ctx, r)
}

// publishFloor times PUBLISH from this process to the subscriber process,
// as toSubscriber times.
func publishFloor(ctx context.Context, e *env, sub *child, rounds int, wait time.Duration) ([]float64, error) {
	return toSubscriber(ctx, e, sub, rounds, wait, nil, func() error { return e.ping.Publish(ctx, floorChannel, "x").Err() })
}

// toSubscriber times rounds messages to the subscriber process, in µs
// from the start of send to the subscriber's receipt: each round runs
// prepare (when not nil), then a PING (wait 0) or wait without traffic,
// then send.
func toSubscriber(ctx context.Context, e *env, sub *child, rounds int, wait time.Duration, prepare, send func() error) ([]float64, error) {
	var gaps []float64
	for range rounds {
		if prepare != nil {
			if err := prepare(); err != nil {
				return nil, err
			}
		}
		if wait > 0 {
			time.Sleep(wait)
		} else if err := e.ping.Ping(ctx).Err(); err != nil {
			return nil, err
		}
		t0 := time.Now().UnixNano()
		if err := send(); err != nil {
			return nil, err
		}
		t1, err := sub.expectInt(ctx, "got", 10*time.Second)
		if err != nil {
			return nil, err
		}
		gaps = append(gaps, float64(t1-t0)/1e3)
	}
	return gaps, nil
}

// subscriberRole: subscribe to r.Name and to the script floor's lock's
// channel, then say "got <unix ns>" for every message.
func subscriberRole(r role, in *bufio.Scanner, out *lineWriter) error {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: r.Redis})
	defer rdb.Close()
	ps := rdb.Subscribe(ctx, r.Name, scriptFloorKeys[0]+":ch")
	for range 2 {
		if _, err := ps.Receive(ctx); err != nil { // the subscriptions' confirmations
			return fmt.Errorf("subscribe: %w", err)
		}
	}
	closed := make(chan struct{})
	go func() { waitForEOF(in); close(closed); _ = ps.Close() }()
	out.say("ready")
	for {
		if _, err := ps.ReceiveMessage(ctx); err != nil {
			select {
			case <-closed:
				return nil
			default:
				return err
			}
		}
		out.say("got %d", time.Now().UnixNano())
	}
}

type handoffGaps struct {
	atOnce, afterHold []float64
	// etcd: rounds, and those whose waiter's watch was unsynced at the
	// release.
	etcdRounds, slowWatchers int
}

// handoffPair is a holder in this process and a waiter process of one
// library.
type handoffPair struct {
	lib    string
	name   string
	holder locker
	waiter *child
}

func newHandoffPair(ctx context.Context, e *env, lib string) (*handoffPair, error) {
	return newPair(ctx, e, lib, "handoff2")
}

// newPair is a holder in this process and a waiter process of lib, on
// the lock (or election) name.
func newPair(ctx context.Context, e *env, lib, name string) (*handoffPair, error) {
	r := e.role("waiter", lib)
	r.Name = name
	holder, err := openLib(r, nil)
	if err != nil {
		return nil, err
	}
	w, err := startChild(ctx, r)
	if err != nil {
		holder.Close()
		return nil, err
	}
	return &handoffPair{lib: lib, name: r.Name, holder: holder, waiter: w}, nil
}

func (p *handoffPair) close() {
	p.waiter.stop()
	p.holder.Close()
}

// run hands the lock over from this process to the waiter process,
// rounds times released at once and rounds times after hold.
func (p *handoffPair) run(ctx context.Context, e *env, rounds int, hold time.Duration) (handoffGaps, error) {
	var g handoffGaps
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	const limit = 30 * time.Second
	w := p.waiter
	for _, wait := range []time.Duration{0, hold} {
		for range rounds {
			h, err := p.holder.Acquire(ctx, p.name)
			if err != nil {
				return g, err
			}
			if err := w.send("acquire"); err != nil {
				return g, err
			}
			if !isEtcd(p.lib) {
				if _, err := w.expect(ctx, "waiting", limit); err != nil {
					return g, err
				}
			}
			slow, err := e.waitQueued(ctx, p.lib, p.name)
			if err != nil {
				return g, err
			}
			if isEtcd(p.lib) {
				g.etcdRounds++
				if slow {
					g.slowWatchers++
				}
			}
			if wait > 0 {
				time.Sleep(wait)
			}
			t0 := time.Now().UnixNano()
			if err := h.Release(ctx); err != nil {
				return g, fmt.Errorf("release: %w", err)
			}
			t1, err := w.expectInt(ctx, "acquired", limit)
			if err != nil {
				return g, err
			}
			if _, err := w.expect(ctx, "released", limit); err != nil {
				return g, err
			}
			gap := float64(t1-t0) / 1e3
			if wait > 0 {
				g.afterHold = append(g.afterHold, gap)
			} else {
				g.atOnce = append(g.atOnce, gap)
			}
		}
	}
	return g, nil
}

// waitQueued polls the server until the other process' waiter is queued on
// name: for fence, in the name's queue and subscribed to its channel; for
// etcd, its key is under the mutex's prefix and a watch exists. slow:
// etcd's watch is unsynced.
func (e *env) waitQueued(ctx context.Context, lib, name string) (slow bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		ok, slow, err := e.queued(ctx, lib, name)
		if err != nil {
			return false, err
		}
		if ok {
			return slow, nil
		}
		if ctx.Err() != nil {
			return false, fmt.Errorf("%s: the waiter process did not queue on %q within 30s", lib, name)
		}
		// The waiter shares this process' CPU: do not spin.
		time.Sleep(200 * time.Microsecond)
	}
}

func (e *env) queued(ctx context.Context, lib, name string) (ok, slow bool, err error) {
	switch lib {
	case "fence", electionName: // a candidate waits in the lock's queue
		n, err := e.ping.HLen(ctx, "fence:{"+name+"}:w").Result()
		if err != nil || n != 1 {
			return false, false, err
		}
		subs, err := e.subscribers(ctx, "fence:{"+name+"}:ch")
		return subs >= 1, false, err
	case etcdName, etcdElectionName:
		prefix := etcdPrefix + name + "/"
		if lib == etcdElectionName {
			prefix = etcdElectionPrefix + name + "/"
		}
		resp, err := e.etcdc.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != 2 {
			return false, false, err
		}
		m, err := e.etcd.metrics(ctx, "etcd_debugging_mvcc_watcher_total", "etcd_debugging_mvcc_slow_watcher_total")
		if err != nil {
			return false, false, err
		}
		return m["etcd_debugging_mvcc_watcher_total"] >= 1, m["etcd_debugging_mvcc_slow_watcher_total"] >= 1, nil
	}
	return false, false, fmt.Errorf("no queue probe for %q", lib)
}

// subscribers counts the subscriptions to a channel, plain and sharded.
func (e *env) subscribers(ctx context.Context, ch string) (int64, error) {
	plain, err := e.ping.PubSubNumSub(ctx, ch).Result()
	if err != nil {
		return 0, err
	}
	shard, err := e.ping.PubSubShardNumSub(ctx, ch).Result()
	if err != nil {
		return 0, err
	}
	return plain[ch] + shard[ch], nil
}

// waiterRole: on "acquire", Acquire the name, say "acquired <unix ns>",
// release it and say "released". It says "waiting" when its library's
// WaitObserver fires.
func waiterRole(r role, in *bufio.Scanner, out *lineWriter) error {
	var onWait waitFunc
	if !isEtcd(r.Lib) {
		onWait = func(context.Context) { out.say("waiting") }
	}
	l, err := openLib(r, onWait)
	if err != nil {
		return err
	}
	defer l.Close()
	out.say("ready")
	return serveCommands(in, func(cmd string) error {
		if cmd != "acquire" {
			return fmt.Errorf("unknown command %q", cmd)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		h, err := l.Acquire(ctx, r.Name)
		t1 := time.Now().UnixNano()
		if err != nil {
			return fmt.Errorf("acquire: %w", err)
		}
		out.say("acquired %d", t1)
		if err := h.Release(ctx); err != nil {
			return fmt.Errorf("release: %w", err)
		}
		out.say("released")
		return nil
	})
}

// etcdWatchProbe times a bare etcd watch across processes: this process
// creates a key, a child watches it (from the revision its Get read, or
// the next one), this process deletes it at once; µs from the start of
// the delete to the child's event.
func etcdWatchProbe(ctx context.Context, e *env, w *child, next bool, rounds int) ([]float64, error) {
	key := etcdPrefix + "watch-probe"
	from := "rev"
	if next {
		from = "next"
	}
	var gaps []float64
	for range rounds {
		if _, err := e.etcdc.Put(ctx, key, ""); err != nil {
			return nil, err
		}
		// Another write, so that the Get's revision is past the key's
		// creation, as a Mutex waiter's Get is past its predecessor's.
		if _, err := e.etcdc.Put(ctx, key+"-bump", ""); err != nil {
			return nil, err
		}
		if err := w.send("watch %s", from); err != nil {
			return nil, err
		}
		if _, err := w.expect(ctx, "watching", 30*time.Second); err != nil {
			return nil, err
		}
		t0 := time.Now().UnixNano()
		if _, err := e.etcdc.Delete(ctx, key); err != nil {
			return nil, err
		}
		t1, err := w.expectInt(ctx, "deleted", 30*time.Second)
		if err != nil {
			return nil, err
		}
		gaps = append(gaps, float64(t1-t0)/1e3)
	}
	return gaps, nil
}

// etcdWatchRole: on "watch rev|next", Get the key, watch it from the
// Get's revision (or the next), say "watching" once the server has the
// watch, and "deleted <unix ns>" at its delete event.
func etcdWatchRole(r role, in *bufio.Scanner, out *lineWriter) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{r.Etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	out.say("ready")
	return serveCommands(in, func(cmd string) error {
		from, ok := strings.CutPrefix(cmd, "watch ")
		if !ok {
			return fmt.Errorf("unknown command %q", cmd)
		}
		t1, err := watchDelete(cli, r.Name, from == "next", out)
		if err != nil {
			return err
		}
		out.say("deleted %d", t1)
		return nil
	})
}

func watchDelete(cli *clientv3.Client, key string, next bool, out *lineWriter) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := cli.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	rev := g.Header.Revision
	if next {
		rev++
	}
	wch := cli.Watch(ctx, key, clientv3.WithRev(rev), clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		return 0, fmt.Errorf("watch of %s not created: %v", key, wr.Err())
	}
	out.say("watching")
	for wr := range wch {
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return time.Now().UnixNano(), nil
			}
		}
		if err := wr.Err(); err != nil {
			return 0, err
		}
	}
	return 0, errors.New("watch of " + key + " ended without its delete")
}

func (e *env) etcdVersion() string {
	if e.etcd == nil {
		return ""
	}
	return e.etcd.Version
}
