package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

type results struct {
	Schema    int                  `json:"schema"`
	Started   time.Time            `json:"started"`
	Seconds   float64              `json:"seconds"`
	Command   string               `json:"command"`
	Args      []string             `json:"args"`
	Placement placement            `json:"placement"`
	Settings  map[string]string    `json:"library_settings"`
	Config    config               `json:"config"`
	Order     []string             `json:"scenario_order"`
	Scenarios map[string]*scenario `json:"scenarios"`
	Goals     []goal               `json:"goals"`
	Notes     []string             `json:"notes,omitempty"`

	issue string // the issue of the goals being added
}

// scenario holds one scenario's figures: per library (or variant), per
// metric.
type scenario struct {
	Libs    []string                      `json:"libs"`
	Figures map[string]map[string]*figure `json:"figures"`
	Ratios  map[string]float64            `json:"ratios,omitempty"`
	Extra   map[string]any                `json:"extra,omitempty"`
	Notes   []string                      `json:"notes,omitempty"`
	Error   string                        `json:"error,omitempty"`
	Seconds float64                       `json:"seconds"`
}

type goal struct {
	Issue    string  `json:"issue,omitempty"`
	Scenario string  `json:"scenario"`
	Goal     string  `json:"goal"`
	Measured float64 `json:"measured"`
	Limit    float64 `json:"limit"`
	// Met is nil when the figure could not be measured.
	Met  *bool  `json:"met"`
	Note string `json:"note,omitempty"`
}

func newResults(cfg config) *results {
	return &results{
		Schema: 1, Started: time.Now().UTC(), Config: cfg,
		Command:   "make bench (cd bench && go run . -out results/latest.json)",
		Args:      os.Args[1:],
		Scenarios: map[string]*scenario{},
	}
}

func (r *results) scenario(name string) *scenario {
	s, ok := r.Scenarios[name]
	if !ok {
		s = &scenario{Figures: map[string]map[string]*figure{}, Ratios: map[string]float64{}, Extra: map[string]any{}}
		r.Scenarios[name] = s
		r.Order = append(r.Order, name)
	}
	return s
}

func (s *scenario) set(lib, metric string, f *figure) {
	m, ok := s.Figures[lib]
	if !ok {
		m = map[string]*figure{}
		s.Figures[lib] = m
		s.Libs = append(s.Libs, lib)
	}
	m[metric] = f
}

func (s *scenario) get(lib, metric string) *figure {
	if s == nil {
		return nil
	}
	if m, ok := s.Figures[lib]; ok {
		return m[metric]
	}
	return nil
}

// addGoal records a goal; lower says whether measured must be <= limit
// (true) or >= limit (false). NaN means not measured.
func (r *results) addGoal(scn, text string, measured, limit float64, lower bool, note string) {
	g := goal{Issue: r.issue, Scenario: scn, Goal: text, Measured: round3(measured), Limit: limit, Note: note}
	if !math.IsNaN(measured) && !math.IsInf(measured, 0) {
		met := measured <= limit
		if !lower {
			met = measured >= limit
		}
		g.Met = &met
	} else {
		g.Measured = 0
	}
	r.Goals = append(r.Goals, g)
}

func round3(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	return math.Round(x*1000) / 1000
}

// status says whether a goal is met, and when not by how much: the
// measured value as a multiple of the limit.
func (g goal) status() string {
	switch {
	case g.Met == nil:
		return "not measured"
	case *g.Met:
		return "met"
	case g.Limit == 0:
		return fmt.Sprintf("not met (%s, the limit is 0)", fmtNum(g.Measured))
	default:
		return fmt.Sprintf("not met, %s× the limit", fmtRatio(g.Measured/g.Limit))
	}
}

// fmtRatio prints a ratio with two decimals, or three when two would make
// it look equal to 1.
func fmtRatio(x float64) string {
	s := fmt.Sprintf("%.2f", x)
	if s == "1.00" {
		s = fmt.Sprintf("%.3f", x)
	}
	return s
}

func fmtNum(x float64) string {
	switch {
	case math.IsNaN(x):
		return "–"
	case math.Abs(x) >= 1000:
		return fmt.Sprintf("%.0f", x)
	case math.Abs(x) >= 100:
		return fmt.Sprintf("%.1f", x)
	case math.Abs(x) >= 10:
		return fmt.Sprintf("%.2f", x)
	default:
		return fmt.Sprintf("%.3g", x)
	}
}

// cell renders a figure as "median (p99)"; for latency figures with pooled
// samples the pooled median and p99 over every sample of every repetition.
func cell(f *figure) string {
	if f == nil {
		return "–"
	}
	if f.Pooled != nil {
		return fmt.Sprintf("%s (p99 %s)", fmtNum(f.Pooled.Median), fmtNum(f.Pooled.P99))
	}
	return fmt.Sprintf("%s (p99 %s)", fmtNum(f.Median), fmtNum(f.P99))
}

func printMarkdown(w io.Writer, r *results) {
	pl := r.Placement
	fmt.Fprintf(w, "\n## fencelock benchmarks — %s\n\n", r.Started.Format(time.RFC3339))
	fmt.Fprintf(w, "Placement: pinned=%v, client CPUs %v (GOMAXPROCS=%d), Redis CPUs %v, Postgres CPUs %v; %d CPUs (%s); load avg at start %s, end %s. Redis %s, Postgres %s, %s. %d repetitions, libraries interleaved (order rotated per repetition).\n\n",
		pl.Pinned, pl.ClientCPUs, pl.GOMAXPROCS, pl.RedisCPUs, pl.PostgresCPUs, pl.NumCPU, pl.CPUModel,
		pl.LoadAvgStart, pl.LoadAvgEnd, pl.RedisVersion, pl.PostgresVer, pl.GoVersion, r.Config.Reps)
	printHeadline(w, r)
	printFairLock(w, r)
	printShapes(w, r)
	met, total := 0, 0
	for _, g := range r.Goals {
		total++
		if g.Met != nil && *g.Met {
			met++
		}
	}
	fmt.Fprintf(w, "Goals met: %d of %d (see the goals tables at the end).\n\n", met, total)
	fmt.Fprintf(w, "Figures: median (p99). Latencies pool every sample of every repetition; rates are per repetition (p99 = worst repetition).\n\n")
	for _, name := range r.Order {
		s := r.Scenarios[name]
		fmt.Fprintf(w, "### %s\n\n", name)
		if s.Error != "" {
			fmt.Fprintf(w, "**error:** %s\n\n", s.Error)
		}
		metrics := metricOrder(s)
		if len(metrics) > 0 {
			fmt.Fprintf(w, "| library | %s |\n|---|%s\n", strings.Join(metrics, " | "), strings.Repeat("---|", len(metrics)))
			for _, lib := range s.Libs {
				row := []string{lib}
				for _, m := range metrics {
					row = append(row, cell(s.get(lib, m)))
				}
				fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
			}
			fmt.Fprintln(w)
		}
		if len(s.Ratios) > 0 {
			keys := make([]string, 0, len(s.Ratios))
			for k := range s.Ratios {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			var parts []string
			for _, k := range keys {
				parts = append(parts, fmt.Sprintf("%s = %s", k, fmtNum(s.Ratios[k])))
			}
			fmt.Fprintf(w, "Ratios (median of per-repetition ratios): %s\n\n", strings.Join(parts, "; "))
		}
		for _, n := range s.Notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
		if len(s.Notes) > 0 {
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "### goals\n\n")
	printGoals(w, r.Goals, "####", nil)
	fmt.Fprintf(w, "Settings:\n")
	keys := make([]string, 0, len(r.Settings))
	for k := range r.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "- %s: %s\n", k, r.Settings[k])
	}
	fmt.Fprintln(w)
}

// metricOrder lists a scenario's metrics in the order they were first set.
func metricOrder(s *scenario) []string {
	seen := map[string]bool{}
	var out []string
	for _, lib := range s.Libs {
		ms := make([]string, 0, len(s.Figures[lib]))
		for m := range s.Figures[lib] {
			ms = append(ms, m)
		}
		sort.Strings(ms)
		for _, m := range ms {
			if !seen[m] {
				seen[m] = true
				out = append(out, m)
			}
		}
	}
	return out
}

type summaryLine struct {
	Results   string             `json:"results"`
	Seconds   float64            `json:"seconds"`
	Pinned    bool               `json:"pinned"`
	GoalsMet  int                `json:"goals_met"`
	GoalsNot  int                `json:"goals_not_met"`
	GoalsNA   int                `json:"goals_not_measured"`
	Goals     []goal             `json:"goals"`
	Headlines map[string]float64 `json:"headlines"`
}

func (r *results) summary(path string) summaryLine {
	s := summaryLine{Results: path, Seconds: round3(r.Seconds), Pinned: r.Placement.Pinned, Goals: r.Goals, Headlines: map[string]float64{}}
	for _, g := range r.Goals {
		switch {
		case g.Met == nil:
			s.GoalsNA++
		case *g.Met:
			s.GoalsMet++
		default:
			s.GoalsNot++
		}
	}
	add := func(key, scn, lib, metric string) {
		if f := r.Scenarios[scn].get(lib, metric); f != nil {
			v := f.Median
			if f.Pooled != nil {
				v = f.Pooled.Median
			}
			s.Headlines[key] = round3(v)
		}
	}
	add("ping_us", "rtt", "PING", "latency_us")
	for _, lib := range []string{"fence", "redsync", "redislock"} {
		add(lib+"_uncontended_us", "uncontended", lib, "latency_us")
		add(lib+"_parallel_ops", "parallel", lib, "ops_per_s")
		add(lib+"_handoff_us", "handoff", lib, "gap_us")
		add(lib+"_contended_acq_per_s", "contended", lib, "acq_per_s")
	}
	return s
}

// printHeadline is the short table bench/README.md shows: the lock scenarios,
// one column per library, medians.
func printHeadline(w io.Writer, r *results) {
	libs := []string{"fence", "redsync", "redislock"}
	type row struct{ label, scn, metric string }
	rows := []row{
		{"uncontended acquire+release, µs", "uncontended", "latency_us"},
		{"parallel (16 names), ops/s", "parallel", "ops_per_s"},
		{"handoff gap, µs", "handoff", "gap_us"},
		{"contended (16 on 1 name), acquisitions/s", "contended", "acq_per_s"},
		{"contended wait p99, ms", "contended", "wait_p99_ms"},
		{"contended min/max per goroutine", "contended", "min_max"},
		{"contended Redis commands/acquisition", "contended", "cmds_per_acq"},
	}
	val := func(scn, lib, metric string) string {
		f := r.Scenarios[scn].get(lib, metric)
		if f == nil {
			return "–"
		}
		if f.Pooled != nil {
			return fmtNum(f.Pooled.Median)
		}
		return fmtNum(f.Median)
	}
	fmt.Fprintf(w, "| median | %s |\n|---|---|---|---|\n", strings.Join(libs, " | "))
	if _, ok := r.Scenarios["rtt"]; ok {
		fmt.Fprintf(w, "| PING round trip, µs | %s | | |\n", val("rtt", "PING", "latency_us"))
	}
	for _, x := range rows {
		if _, ok := r.Scenarios[x.scn]; !ok {
			continue
		}
		cells := make([]string, len(libs))
		for i, l := range libs {
			cells[i] = val(x.scn, l, x.metric)
		}
		fmt.Fprintf(w, "| %s | %s |\n", x.label, strings.Join(cells, " | "))
	}
	if _, ok := r.Scenarios["renewal"]; ok {
		for _, n := range r.Config.RenewalLocks {
			lib := fmt.Sprintf("fence %d locks", n)
			fmt.Fprintf(w, "| renewal of %d locks: round trips/period; ms/period (hand-written pipeline; redislock Refresh loop) | %s; %s | | (%s; %s) |\n", n,
				val("renewal", lib, "round_trips_per_period"), val("renewal", lib, "busy_ms_per_period"),
				val("renewal", fmt.Sprintf("floor pipeline %d", n), "busy_ms_per_period"),
				val("renewal", fmt.Sprintf("redislock loop %d", n), "busy_ms_per_period"))
		}
	}
	if s, ok := r.Scenarios["cluster"]; ok {
		fmt.Fprintf(w, "| Redis Cluster (3 masters + 3 replicas), 16 on 1 name: acquisitions/s (single Redis); cluster/single | %s (%s); %s | | |\n",
			val("cluster", "fence cluster", "acq_per_s"), val("cluster", "fence single", "acq_per_s"), fmtNum(s.Ratios["contended acq_per_s cluster/single"]))
		for _, n := range r.Config.RenewalLocks {
			lib := fmt.Sprintf("fence %d locks", n)
			fmt.Fprintf(w, "| Redis Cluster, renewal of %d locks: round trips per node per period (worst node); ms/period (hand-written cluster pipeline) | %s; %s (%s) | | |\n", n,
				val("cluster", lib, "round_trips_per_node_period_max"), val("cluster", lib, "busy_ms_per_period"),
				val("cluster", fmt.Sprintf("floor pipeline %d", n), "busy_ms_per_period"))
		}
	}
	if s, ok := r.Scenarios["guard"]; ok {
		fmt.Fprintf(w, "| guard.Exec / plain tx (direct; 1 ms proxy) | %s; %s | | |\n",
			fmtNum(s.Ratios["guarded/plain direct"]), fmtNum(s.Ratios["guarded/plain proxied 1ms each way"]))
		fmt.Fprintf(w, "| floor (plain + 2 prepared no-op statements) / plain tx (direct; 1 ms proxy) | %s; %s | | |\n",
			fmtNum(s.Ratios["floor/plain direct"]), fmtNum(s.Ratios["floor/plain proxied 1ms each way"]))
	}
	if s, ok := r.Scenarios["sqlfence"]; ok {
		fmt.Fprintf(w, "| sqlfence guard.Exec / plain database/sql tx (pgx; lib/pq) | %s; %s | | |\n",
			fmtNum(s.Ratios["guarded/plain pgx"]), fmtNum(s.Ratios["guarded/plain postgres"]))
	}
	if s, ok := r.Scenarios["sync"]; ok {
		fmt.Fprintf(w, "| stock sync rows/s, guard on / off | %s | | |\n", fmtNum(s.Ratios["on/off"]))
	}
	fmt.Fprintln(w)
}

// printGoals prints a table of goals per issue, in the order the issues
// first appear; only those issues when given.
func printGoals(w io.Writer, goals []goal, heading string, only []string) {
	var issues []string
	for _, g := range goals {
		if !slices.Contains(issues, g.Issue) && (only == nil || slices.Contains(only, g.Issue)) {
			issues = append(issues, g.Issue)
		}
	}
	for _, is := range issues {
		if is != "" {
			fmt.Fprintf(w, "%s %s\n\n", heading, is)
		}
		fmt.Fprintf(w, "| scenario | goal | measured | limit | status | note |\n|---|---|---|---|---|---|\n")
		for _, g := range goals {
			if g.Issue != is {
				continue
			}
			// Three decimals, so that a value just over its limit does
			// not print as equal to it.
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", g.Scenario, g.Goal, fmtGoal(g.Measured), fmtGoal(g.Limit), g.status(), g.Note)
		}
		fmt.Fprintln(w)
	}
}

// fairLockLibs are the columns of the fair lock's table.
var fairLockLibs = []string{"fence", "redislock", "redsync", etcdName}

// printFairLock is the fair lock's table: fence against the Redis peers
// and etcd, in the cross-process scenarios, the parallel one and the
// queue's.
func printFairLock(w io.Writer, r *results) {
	_, h2 := r.Scenarios["handoff2"]
	_, fair := r.Scenarios["fair"]
	_, par := r.Scenarios["parallel"]
	if !h2 && !fair && !par {
		return
	}
	val := func(scn, lib, metric string) string { return medianOf(r.Scenarios[scn].get(lib, metric)) }
	line := func(label string, cell func(lib string) string) { fairLockLine(w, label, cell) }
	row := func(label, scn string, metrics ...string) {
		if _, ok := r.Scenarios[scn]; !ok {
			return
		}
		line(label, func(l string) string {
			var parts []string
			for _, m := range metrics {
				parts = append(parts, val(scn, l, m))
			}
			c := strings.Join(parts, "; ")
			if strings.Trim(c, "–; ") == "" {
				return "–"
			}
			return c
		})
	}
	c := r.Config
	fmt.Fprintf(w, "| the fair lock, median | %s |\n|---|%s\n", strings.Join(fairLockLibs, " | "), strings.Repeat("---|", len(fairLockLibs)))
	if h2 {
		printHandoff2Rows(r, val, line)
	}
	who := fmt.Sprintf("%d processes × %d goroutines, %v hold", c.FairClients, c.FairGoroutines, c.FairHold)
	row(who+": acquisitions/s", "fair", "acq_per_s")
	row("… min/max acquisitions per process", "fair", "min_max")
	row("… grants out of arrival order per repetition", "fair", "out_of_order")
	row("… lock server CPU per acquisition, µs", "fair", "server_cpu_us_per_acq")
	row(fmt.Sprintf("%d goroutines on %d names (parallel): Redis CPU per acquire+release, µs", c.ParallelWorkers, c.ParallelWorkers), "parallel", "redis_cpu_us_per_op")
	row("… of it in the commands the scripts call; in the Lua call itself; outside any command, µs", "parallel", "redis_in_commands_us_per_op", "redis_in_lua_us_per_op", "redis_outside_commands_us_per_op")
	row("… commands the scripts call per acquire+release", "parallel", "redis_cmds_per_op")
	row("… the bench process' CPU per acquire+release, µs", "parallel", "client_cpu_us_per_op")
	row("… the bench process' context switches per acquire+release", "parallel", "client_switches_per_op")
	row(fmt.Sprintf("%d queued waiters: Redis memory per waiter, B; a release in SLOWLOG, µs", c.QueueWaiters), "queue", "memory_per_waiter_bytes", "release_slowlog_us")
	row(fmt.Sprintf("5 waiters SIGKILLed at the head (liveness %v): the next live waiter holds after, s", c.HeadLiveness), "headkill", "next_holder_s")
	fmt.Fprintln(w)
}

// printHandoff2Rows are the fair lock's table's rows of handoff2, which
// runs fence and etcd: the Redis peers' cells stay empty.
func printHandoff2Rows(r *results, val func(scn, lib, metric string) string, line func(string, func(string) string)) {
	gap := func(m string) func(string) string {
		return func(l string) string {
			if l == "redislock" || l == "redsync" {
				return ""
			}
			return val("handoff2", l, m)
		}
	}
	line(fmt.Sprintf("handoff between 2 processes, released once the waiter is queued, µs (PING %s; PUBLISH to another process %s; fence's release.lua handing over from a bare client %s)",
		val("handoff2", "PING", gapAtOnce), val("handoff2", floorName, gapAtOnce), val("handoff2", scriptFloorName, gapAtOnce)), gap(gapAtOnce))
	line(fmt.Sprintf("… released after a %v hold, µs (PING after the same idle %s; PUBLISH %s; release.lua %s)", r.Config.HandoffHold,
		val("handoff2", "PING", gapAfterHold), val("handoff2", floorName, gapAfterHold), val("handoff2", scriptFloorName, gapAfterHold)), gap(gapAfterHold))
	steps := []string{"PUBLISH " + val("handoff2", floorName, redisAtOnce), "release.lua " + val("handoff2", scriptFloorName, redisAtOnce)}
	for _, st := range handoverSteps {
		steps = append(steps, stepName(st.row)+" "+val("handoff2", st.row, redisAtOnce))
	}
	line("… Redis time per call handing over at once, µs: "+strings.Join(steps, "; "), func(string) string { return "" })
	if r.Scenarios["handoff2"].get(etcdWatchRev, gapAtOnce) == nil {
		return
	}
	line("a bare etcd watch across processes, delete → event, µs: watching from the Get's revision (as the Mutex does); from the next revision", func(l string) string {
		if l != etcdName {
			return ""
		}
		return val("handoff2", etcdWatchRev, gapAtOnce) + "; " + val("handoff2", etcdWatchNxt, gapAtOnce)
	})
}

// fairLockLine prints a row of the fair lock's table: its label, then
// cell(lib) for each library.
func fairLockLine(w io.Writer, label string, cell func(lib string) string) {
	cells := make([]string, len(fairLockLibs))
	for i, l := range fairLockLibs {
		cells[i] = cell(l)
	}
	fmt.Fprintf(w, "| %s | %s |\n", label, strings.Join(cells, " | "))
}

// medianOf is a figure's median as the tables print it: over every
// sample when it pools them, "–" when there is none.
func medianOf(f *figure) string {
	switch {
	case f == nil:
		return "–"
	case f.Pooled != nil:
		return fmtNum(f.Pooled.Median)
	default:
		return fmtNum(f.Median)
	}
}

func fmtGoal(x float64) string {
	if math.IsNaN(x) || math.Abs(x) >= 100 {
		return fmtNum(x)
	}
	return fmt.Sprintf("%.3f", x)
}
