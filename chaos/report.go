package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// KindStats are the figures of one fault kind.
type KindStats struct {
	Trials     int `json:"trials"`
	Faults     int `json:"faults"` // faults actually injected
	Ops        int `json:"ops"`
	Violations int `json:"violations"`
	// Outcomes counts operations by outcome (ok, stale, dup, fail, crash).
	Outcomes map[Outcome]int `json:"outcomes"`
	// LinearizabilityUnknown counts resources porcupine could not decide in time.
	LinearizabilityUnknown int `json:"linearizability_unknown,omitempty"`
	// Errors counts trials that could not run or whose fault failed.
	Errors int `json:"errors,omitempty"`
	// FailedButCommitted counts operations that reported an error (or
	// died) although their write committed: ambiguous, legal outcomes.
	FailedButCommitted int `json:"failed_but_committed"`
	// FailedButCommittedErrs samples their errors (distinct, a few).
	FailedButCommittedErrs []string `json:"failed_but_committed_errors,omitempty"`
	// LostElsewhere counts locks lost during cluster faults on masters
	// the fault did not touch.
	LostElsewhere int             `json:"lost_elsewhere,omitempty"`
	Loss          []time.Duration `json:"-"`
	Takeover      []time.Duration `json:"-"`
}

// Report is the result of a run.
type Report struct {
	Seed    int64
	Guard   bool
	Cluster bool
	// PartialCoverage: the cluster ran with cluster-require-full-coverage no.
	PartialCoverage bool
	Lease           time.Duration
	Trials          int
	Elapsed         time.Duration
	Kinds           []string
	PerKind         map[string]*KindStats
	Violations      int
	Errors          int
	// Failed holds the trials that found violations.
	Failed []TrialResult
	// ViolationsByCheck counts violations per check name.
	ViolationsByCheck map[string]int
}

// Run starts private Redis and Postgres servers, runs cfg.Trials trials
// and prints the per-kind table and, last, one JSON line to cfg.Out. A
// trial with violations prints the seed and the offending history slice at
// once. The error is for a run that could not start; violations are in
// the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	e, err := startEnv(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	rep := &Report{Seed: cfg.Seed, Guard: cfg.Guard, Cluster: cfg.Cluster, PartialCoverage: cfg.PartialCoverage, Lease: cfg.Lease, Kinds: cfg.Kinds,
		PerKind: map[string]*KindStats{}, ViolationsByCheck: map[string]int{}}
	for _, k := range cfg.Kinds {
		rep.PerKind[k] = &KindStats{Outcomes: map[Outcome]int{}}
	}
	schedule := faultSchedule(cfg.Seed, cfg.Kinds, cfg.Trials)
	for i := 0; i < cfg.Trials && ctx.Err() == nil; i++ {
		kind := schedule[i]
		rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i)+1))
		t := &trial{n: i, kind: kind, cfg: &cfg, env: e, rec: &Recorder{}, seed: rng.Uint64()}
		r := t.run(ctx, rng)
		st := rep.PerKind[kind]
		st.Trials++
		rep.Trials++
		if r.Err != nil {
			st.Errors++
			rep.Errors++
			fmt.Fprintf(cfg.Out, "chaos: trial %d (%s) could not run: %v\n", i, kind, r.Err)
			continue
		}
		if r.Fault.Err != "" {
			st.Errors++
			rep.Errors++
			fmt.Fprintf(cfg.Out, "chaos: trial %d (%s): fault injection failed: %s\n", i, kind, r.Fault.Err)
		} else {
			st.Faults++
		}
		st.Ops += r.Check.OpsChecked
		st.Violations += len(r.Check.Violations)
		st.LinearizabilityUnknown += r.Check.LinearizabilityUnknown
		for o, n := range r.Outcomes {
			st.Outcomes[o] += n
		}
		st.FailedButCommitted += len(r.Check.FailedButCommitted)
		for _, o := range r.Check.FailedButCommitted {
			msg := o.Err
			if o.Outcome == OutCrash {
				msg = "(worker killed before it could report)"
			}
			if len(st.FailedButCommittedErrs) < 4 && !contains(st.FailedButCommittedErrs, msg) {
				st.FailedButCommittedErrs = append(st.FailedButCommittedErrs, msg)
			}
		}
		st.LostElsewhere += r.LostElsewhere
		st.Loss = append(st.Loss, r.Loss...)
		st.Takeover = append(st.Takeover, r.Takeover...)
		rep.Violations += len(r.Check.Violations)
		for _, v := range r.Check.Violations {
			rep.ViolationsByCheck[v.Check]++
		}
		if cfg.Verbose {
			fmt.Fprintf(cfg.Out, "trial %3d %-21s ops=%-4d violations=%d loss=%v takeover=%v outcomes=%v %v\n",
				i, kind, r.Check.OpsChecked, len(r.Check.Violations), roundAll(r.Loss), roundAll(r.Takeover), r.Outcomes, r.Phases)
		}
		if len(r.Check.Violations) > 0 {
			rep.Failed = append(rep.Failed, r)
			printFailure(cfg.Out, &cfg, r)
			if cfg.StopAtViolation {
				break
			}
		}
	}
	rep.Elapsed = time.Since(start)
	rep.Print(cfg.Out)
	return rep, ctx.Err()
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// printFailure prints the seed and, per violation, the slice of history
// that shows it.
func printFailure(w io.Writer, cfg *Config, r TrialResult) {
	mode := "guard on"
	if !cfg.Guard {
		mode = "guard OFF (control)"
	}
	fmt.Fprintf(w, "chaos: VIOLATION trial %d, fault %s, %s, seed %d (rerun: -seed %d -trials %d)\n",
		r.N, r.Kind, mode, cfg.Seed, cfg.Seed, r.N+1)
	fj, _ := json.Marshal(r.Fault)
	fmt.Fprintf(w, "  fault: %s\n", fj)
	base := r.Fault.At
	rel := func(t int64) string {
		if t == 0 || t == int64(^uint64(0)>>1) {
			return "      ?"
		}
		return fmt.Sprintf("%+7dms", (t-base)/int64(time.Millisecond))
	}
	const maxShown = 3
	for i, v := range r.Check.Violations {
		if i == maxShown {
			fmt.Fprintf(w, "  ... and %d more violations\n", len(r.Check.Violations)-maxShown)
			break
		}
		fmt.Fprintf(w, "  [%s] %s: %s\n", v.Check, v.Resource, v.Detail)
		from, to := v.From-int64(500*time.Millisecond), v.To+int64(500*time.Millisecond)
		if v.From == 0 {
			from, to = 0, int64(^uint64(0)>>1)
		}
		type line struct {
			at int64
			s  string
		}
		var lines []line
		for _, e := range r.Events {
			if e.Resource != v.Resource || e.At < from || e.At > to {
				continue
			}
			switch e.Type {
			case evAcquire, evLost, evRelease:
				s := fmt.Sprintf("w%d %-8s tok=%d", e.Worker, e.Type, e.Token)
				if e.Err != "" {
					s += " (" + e.Err + ")"
				}
				lines = append(lines, line{e.At, s})
			}
		}
		for _, o := range r.Ops {
			if o.Resource == v.Resource && o.Invoke >= from && o.Invoke <= to {
				s := fmt.Sprintf("w%d op %s %s tok=%d", o.Worker, o.ID, o.Kind, o.Token)
				if o.Kind == KindAppend {
					s += fmt.Sprintf(" batch=%d", o.Batch)
				}
				s += fmt.Sprintf(" -> %s at %s", o.Outcome, strings.TrimSpace(rel(o.Complete)))
				if o.Kind == KindIncr && o.Outcome == OutOK {
					s += fmt.Sprintf(" wrote %d", o.Value)
				}
				if o.Err != "" {
					s += " err=" + tailString(o.Err, 160)
				}
				lines = append(lines, line{o.Invoke, s})
			}
		}
		for _, c := range r.DB.Commits {
			if c.Resource == v.Resource && c.At >= from && c.At <= to {
				lines = append(lines, line{c.At, fmt.Sprintf("db commit %v", c)})
			}
		}
		sort.SliceStable(lines, func(i, j int) bool { return lines[i].at < lines[j].at })
		var out []string
		for i, l := range lines {
			if i == 80 {
				out = append(out, fmt.Sprintf("    ... %d more lines", len(lines)-80))
				break
			}
			out = append(out, "    "+rel(l.at)+" "+l.s)
		}
		fmt.Fprintf(w, "  history (ms relative to the fault):\n%s\n", joinLines(out))
	}
	for id, s := range r.Stderr {
		fmt.Fprintf(w, "  worker %d stderr: %s\n", id, strings.TrimSpace(tailString(s, 800)))
	}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

type durStats struct {
	N   int     `json:"n"`
	Min float64 `json:"min"`
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	Max float64 `json:"max"`
}

func stats(ds []time.Duration) durStats {
	if len(ds) == 0 {
		return durStats{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	q := func(p float64) time.Duration { return s[int(p*float64(len(s)-1)+0.5)] }
	return durStats{N: len(s), Min: ms(s[0]), P50: ms(q(0.5)), P95: ms(q(0.95)), Max: ms(s[len(s)-1])}
}

type kindJSON struct {
	KindStats
	LossMS     durStats `json:"loss_detection_ms"`
	TakeoverMS durStats `json:"takeover_ms"`
}

// Summary is the last line of a run's output.
type Summary struct {
	Seed              int64               `json:"seed"`
	Guard             bool                `json:"guard"`
	Cluster           bool                `json:"cluster,omitempty"`
	PartialCoverage   bool                `json:"partial_coverage,omitempty"`
	LeaseMS           int64               `json:"lease_ms"`
	Trials            int                 `json:"trials"`
	Faults            int                 `json:"faults"`
	Ops               int                 `json:"ops"`
	Violations        int                 `json:"violations"`
	Errors            int                 `json:"errors"`
	ElapsedS          float64             `json:"elapsed_s"`
	ViolationsByCheck map[string]int      `json:"violations_by_check"`
	PerKind           map[string]kindJSON `json:"per_kind"`
}

// Summary returns the figures of the run.
func (r *Report) Summary() Summary {
	s := Summary{Seed: r.Seed, Guard: r.Guard, Cluster: r.Cluster, PartialCoverage: r.PartialCoverage, LeaseMS: r.Lease.Milliseconds(), Trials: r.Trials,
		Violations: r.Violations, Errors: r.Errors, ElapsedS: r.Elapsed.Round(100 * time.Millisecond).Seconds(),
		ViolationsByCheck: r.ViolationsByCheck, PerKind: map[string]kindJSON{}}
	for k, st := range r.PerKind {
		s.Faults += st.Faults
		s.Ops += st.Ops
		s.PerKind[k] = kindJSON{KindStats: *st, LossMS: stats(st.Loss), TakeoverMS: stats(st.Takeover)}
	}
	return s
}

// Print writes the per-kind table and, as the last line, the JSON summary.
func (r *Report) Print(w io.Writer) {
	mode := "guard on"
	if !r.Guard {
		mode = "guard OFF (control)"
	}
	topo := "one Redis"
	if r.Cluster {
		topo = "Redis Cluster (3 masters + 3 replicas, node timeout " + clusterNodeTimeout.String() + ")"
		if r.PartialCoverage {
			topo += ", cluster-require-full-coverage no"
		}
	}
	fmt.Fprintf(w, "\nchaos: %d trials on %s, %s, lease %v, seed %d, %v\n", r.Trials, topo, mode, r.Lease, r.Seed, r.Elapsed.Round(time.Second))
	fmt.Fprintf(w, "%-22s %6s %6s %6s %10s  %-27s %-27s %s\n", "fault", "trials", "faults", "ops", "violations",
		"loss detect ms p50/p95/max", "takeover ms p50/p95/max", "outcomes")
	for _, k := range r.Kinds {
		st := r.PerKind[k]
		l, t := stats(st.Loss), stats(st.Takeover)
		extra := ""
		if r.Cluster {
			extra = fmt.Sprintf(" lost-on-other-masters=%d", st.LostElsewhere)
		}
		fmt.Fprintf(w, "%-22s %6d %6d %6d %10d  %-27s %-27s %v err-but-committed=%d%s\n", k, st.Trials, st.Faults, st.Ops, st.Violations,
			fmtStats(l), fmtStats(t), st.Outcomes, st.FailedButCommitted, extra)
	}
	b, _ := json.Marshal(r.Summary())
	fmt.Fprintf(w, "%s\n", b)
}

func fmtStats(s durStats) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f/%.0f/%.0f (n=%d)", s.P50, s.P95, s.Max, s.N)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// faultSchedule is the fault kind of each trial: every block of len(kinds)
// trials runs each kind once, in an order drawn from seed, so that -seed
// reproduces the schedule.
func faultSchedule(seed int64, kinds []string, trials int) []string {
	order := rand.New(rand.NewPCG(uint64(seed), 0x6b696e6473))
	out := make([]string, 0, trials)
	var perm []int
	for i := 0; i < trials; i++ {
		if i%len(kinds) == 0 {
			perm = order.Perm(len(kinds))
		}
		out = append(out, kinds[perm[i%len(kinds)]])
	}
	return out
}
