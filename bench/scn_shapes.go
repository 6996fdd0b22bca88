package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The shapes scenario says what each of fence's guarantees costs on the
// uncontended path, against redislock in the same repetitions: fence's own
// acquire and release scripts, exactly as the library sends them, called
// from a bare loop (no fence code on the client: what is left of the
// client's cost is the scripts' arguments and replies), then the same
// scripts with one guarantee taken out at a time, cumulatively. Each step
// is a textual edit of the scripts that must match once, so a change of
// the scripts that an edit no longer fits fails the scenario instead of
// measuring something else.

// shapeStep is one guarantee taken out: edits of the composed scripts
// (old → new, each matching exactly once in its script), and whether the
// scripts are then called with the lock and counter keys only.
type shapeStep struct {
	name, label string
	edits       []shapeEdit
	twoKeys     bool
}

type shapeEdit struct {
	release   bool // in release.lua's composed script, else acquire.lua's
	old, repl string
}

// shapeSteps are cumulative: each lib runs the scripts with every edit up
// to its own.
var shapeSteps = []shapeStep{
	{name: "scripts", label: "fence's scripts, from a bare loop"},
	{name: "-publish", label: "… without the release's PUBLISH when nobody is queued (wakes waiters of versions before the queue during a rolling upgrade)",
		edits: []shapeEdit{{release: true, old: "local r = redis.pcall(publish, KEYS[1] .. ':ch', ARGV[1])", repl: "local r = 1"}}},
	{name: "-queue", label: "… and without the queue (the no-barging check and the handover)", twoKeys: true,
		edits: []shapeEdit{
			{old: "redis.call('EXISTS', KEYS[1], KEYS[3])", repl: "redis.call('EXISTS', KEYS[1])"},
			{release: true, old: "local first = redis.call('LPOP', KEYS[3])", repl: "local first = false"},
		}},
	{name: "-clock", label: "… and without the clock floor (the token from INCR of the counter alone)",
		edits: []shapeEdit{{old: "local function next_token()\n", repl: "local function next_token()\n  do return tostring(redis.call('INCR', KEYS[2])) end\n"}}},
}

// fenceScriptSources composes fence's acquire.lua and release.lua as the
// library does for a client without a cluster (fence/scripts.go:
// newScriptSet with PUBLISH): the publish line, then each script with
// queue.lua's two parts at its marker lines. runShapes checks that Redis
// has the result's SHA1s once fence has run, so a drift from the library
// fails the scenario.
func fenceScriptSources() (acquire, release string, err error) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", "", fmt.Errorf("shapes: cannot locate the bench's source to read fence's scripts")
	}
	dir := filepath.Join(filepath.Dir(self), "..", "fence")
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		return string(b), err
	}
	queue, err := read("queue.lua")
	if err != nil {
		return "", "", fmt.Errorf("shapes: %w", err)
	}
	tokens, rest, ok := strings.Cut(queue, "--@queue\n")
	if !ok {
		return "", "", fmt.Errorf("shapes: fence/queue.lua has no --@queue line")
	}
	compose := func(name string) (string, error) {
		s, err := read(name)
		if err != nil {
			return "", err
		}
		for _, part := range [...]struct{ mark, lua string }{{"--@tokens\n", tokens}, {"--@queue\n", rest}} {
			if strings.Count(s, part.mark) != 1 {
				return "", fmt.Errorf("fence/%s needs one %q line", name, part.mark)
			}
			s = strings.Replace(s, part.mark, part.lua, 1)
		}
		return "local publish = 'PUBLISH'\n" + s, nil
	}
	if acquire, err = compose("acquire.lua"); err != nil {
		return "", "", fmt.Errorf("shapes: %w", err)
	}
	if release, err = compose("release.lua"); err != nil {
		return "", "", fmt.Errorf("shapes: %w", err)
	}
	return acquire, release, nil
}

// applyEdits makes edits in the script *src, each of whose old text must
// be in it exactly once (what names the step in the error).
func applyEdits(src *string, edits []shapeEdit, what string) error {
	for _, ed := range edits {
		if n := strings.Count(*src, ed.old); n != 1 {
			return fmt.Errorf("%s: %q is in the script %d times, not once: fence's scripts changed; update the step's edits", what, ed.old, n)
		}
		*src = strings.Replace(*src, ed.old, ed.repl, 1)
	}
	return nil
}

// shapeLocker runs a pair of scripts of fence's shape from a bare loop:
// one EVALSHA to acquire, one to release, as fence's uncontended path.
type shapeLocker struct {
	name             string
	rdb              *redis.Client
	cnt              *counter
	acquire, release *redis.Script
	twoKeys          bool
}

// newShapeLockers makes one locker per step of shapeSteps, each with the
// edits of every step up to it.
func newShapeLockers(addr string) ([]*shapeLocker, error) {
	acq, rel, err := fenceScriptSources()
	if err != nil {
		return nil, err
	}
	var out []*shapeLocker
	two := false
	for _, st := range shapeSteps {
		for _, ed := range st.edits {
			src := &acq
			if ed.release {
				src = &rel
			}
			if err := applyEdits(src, []shapeEdit{ed}, "shapes: step "+st.name); err != nil {
				return nil, err
			}
		}
		two = two || st.twoKeys
		cnt := &counter{}
		out = append(out, &shapeLocker{name: st.name, rdb: newRedisClient(addr, cnt), cnt: cnt,
			acquire: redis.NewScript(acq), release: redis.NewScript(rel), twoKeys: two})
	}
	return out, nil
}

func (s *shapeLocker) Name() string      { return s.name }
func (s *shapeLocker) Counter() *counter { return s.cnt }
func (s *shapeLocker) Close()            { _ = s.rdb.Close() }

// holderID is a holder id of fence's default shape: 16 random bytes in
// unpadded base64url (22 characters).
func holderID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func (s *shapeLocker) Acquire(ctx context.Context, name string) (held, error) {
	base := "shape" + s.name + ":{" + name + "}"
	keys := []string{base, base + ":seq", base + ":q", base + ":w"}
	if s.twoKeys {
		keys = keys[:2]
	}
	v, err := s.acquire.Run(ctx, s.rdb, keys, holderID(), int64(9000), "w:6000:9000").Result()
	if err != nil {
		return nil, err
	}
	value, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("shapes: %s: %q not acquired (%v): the scenario's names are never contended", s.name, name, v)
	}
	return shapeHeld{s, keys, value}, nil
}

type shapeHeld struct {
	s     *shapeLocker
	keys  []string
	value string
}

func (h shapeHeld) Release(ctx context.Context) error {
	n, err := h.s.release.Run(ctx, h.s.rdb, h.keys, h.value).Int64()
	if err == nil && n != 1 {
		err = fmt.Errorf("shapes: %s: release answered %d, want 1 (released, nobody queued)", h.s.name, n)
	}
	return err
}

// shapeLibs are the scenario's columns: fence, the shapes, redislock.
func (e *env) shapeLibs(shapes []*shapeLocker) ([]locker, error) {
	libs := []locker{e.fence}
	for _, s := range shapes {
		libs = append(libs, s)
	}
	for _, l := range e.libs {
		if l.Name() == "redislock" {
			return append(libs, l), nil
		}
	}
	return nil, fmt.Errorf("shapes: redislock is not among the libraries")
}

func runShapes(ctx context.Context, e *env, res *results) error {
	s := res.scenario("shapes")
	shapes, err := newShapeLockers(e.redis.Addr)
	if err != nil {
		return err
	}
	defer func() {
		for _, sh := range shapes {
			sh.Close()
		}
	}()
	// fence has loaded its scripts once it has run: Redis must have the
	// bare loop's first pair by SHA1, or the bench composed something else.
	if h, err := e.fence.Acquire(ctx, "shapes-check"); err != nil {
		return err
	} else if err := h.Release(ctx); err != nil {
		return err
	}
	have, err := e.ping.ScriptExists(ctx, shapes[0].acquire.Hash(), shapes[0].release.Hash()).Result()
	if err != nil {
		return err
	}
	if !have[0] || !have[1] {
		return fmt.Errorf("shapes: Redis has no script of the composed acquire.lua or release.lua after fence ran: the bench composes them unlike fence/scripts.go; update fenceScriptSources")
	}
	libs, err := e.shapeLibs(shapes)
	if err != nil {
		return err
	}
	var ops []op
	for _, l := range libs {
		ops = append(ops, acquireReleaseOp(l, "shapes-uncontended"))
	}
	repMed, pooled, err := interleaved(ctx, e.cfg.Reps, e.cfg.UncontendedOps, ops)
	if err != nil {
		return err
	}
	scriptOnly := map[string]bool{"fence": true}
	for _, sh := range shapes {
		scriptOnly[sh.name] = true
	}
	m, err := measureParallel(ctx, e, libs, scriptOnly)
	if err != nil {
		return err
	}
	for _, l := range libs {
		n := l.Name()
		s.set(n, "latency_us", newFigure("µs", repMed[n], pooled[n]))
		m.record(s, n)
		if n == "redislock" {
			continue
		}
		s.Ratios["latency "+n+"/redislock"] = pairedRatio(repMed[n], repMed["redislock"])
		s.Ratios["ops "+n+"/redislock"] = pairedRatio(m.rates[n], m.rates["redislock"])
		s.Ratios["redis_cpu "+n+"/redislock"] = pairedRatio(m.srvUs[n], m.srvUs["redislock"])
		s.Ratios["client_cpu "+n+"/redislock"] = pairedRatio(m.cliUs[n], m.cliUs["redislock"])
	}
	s.Notes = append(s.Notes, "fence's acquire.lua and release.lua as the library composes them (checked by SHA1 against what fence loaded), called from a bare go-redis loop, then with one guarantee taken out at a time, cumulatively: "+shapeStepNames()+". latency: one goroutine, acquire then release of one name, interleaved with fence and redislock as in uncontended; ops/s, Redis CPU and client CPU: as in parallel. Ratios are to redislock in the same repetitions.")
	return nil
}

// printShapes is the shapes scenario's table: per column of the scenario,
// the ratios to redislock of the same repetitions, and the commands its
// scripts call.
func printShapes(w io.Writer, r *results) {
	s, ok := r.Scenarios["shapes"]
	if !ok || s.Error != "" {
		return
	}
	fmt.Fprintf(w, "| what each guarantee costs, uncontended (fence's scripts from a bare loop, then one guarantee out at a time) ÷ redislock, median | latency | ops/s (%d names) | Redis CPU | client CPU | client context switches per op | commands the scripts call |\n|---|---|---|---|---|---|---|\n", r.Config.ParallelWorkers)
	row := func(lib, label string) {
		cmds := "–"
		if f := s.get(lib, "redis_cmds_per_op"); f != nil {
			cmds = fmtNum(f.Median)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", label, fmtGoal(s.Ratios["latency "+lib+"/redislock"]), fmtGoal(s.Ratios["ops "+lib+"/redislock"]),
			fmtGoal(s.Ratios["redis_cpu "+lib+"/redislock"]), fmtGoal(s.Ratios["client_cpu "+lib+"/redislock"]), medianOf(s.get(lib, "client_switches_per_op")), cmds)
	}
	row("fence", "fence, the library")
	for _, st := range shapeSteps {
		row(st.name, st.label)
	}
	fmt.Fprintf(w, "| redislock: µs; ops/s; Redis CPU, µs; client CPU, µs; context switches | %s | %s | %s | %s | %s | 2 (its acquisition is a SET, not a script) |\n\n", medianOf(s.get("redislock", "latency_us")),
		medianOf(s.get("redislock", "ops_per_s")), medianOf(s.get("redislock", "redis_cpu_us_per_op")), medianOf(s.get("redislock", "client_cpu_us_per_op")), medianOf(s.get("redislock", "client_switches_per_op")))
}

// shapesNote is what a goal's note says of the shapes scenario for metric
// (latency, ops, redis_cpu, client_cpu): its ratios to redislock, fence's
// and each step's (see "What each guarantee costs" in bench/README.md);
// "" when it did not run.
func (r *results) shapesNote(metric string) string {
	sh, ok := r.Scenarios["shapes"]
	if !ok || sh.Error != "" {
		return ""
	}
	var parts []string
	for _, st := range shapeSteps {
		parts = append(parts, st.name+" "+fmtGoal(sh.Ratios[metric+" "+st.name+"/redislock"]))
	}
	return "; ÷ redislock in the shapes scenario: fence " + fmtGoal(sh.Ratios[metric+" fence/redislock"]) + ", " + strings.Join(parts, ", ")
}

func shapeStepNames() string {
	var parts []string
	for _, st := range shapeSteps {
		parts = append(parts, st.name+" ("+st.label+")")
	}
	return strings.Join(parts, "; ")
}
