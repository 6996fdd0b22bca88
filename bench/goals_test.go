package main

import (
	"bytes"
	"context"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A missed goal says by how much: the measured value as a multiple of its
// limit.
func TestGoalStatusSaysByHowMuch(t *testing.T) {
	r := &results{}
	r.addGoal("s", "lower", 2.62, 2, true, "")
	r.addGoal("s", "higher", 1.14, 1.6, false, "")
	r.addGoal("s", "zero", 3, 0, true, "")
	r.addGoal("s", "met", 1.9, 2, true, "")
	r.addGoal("s", "nan", math.NaN(), 2, true, "")
	r.addGoal("s", "just over", 1.051, 1.05, true, "")
	want := []string{
		"not met, 1.31× the limit",
		"not met, 0.71× the limit",
		"not met (3, the limit is 0)",
		"met",
		"not measured",
		"not met, 1.001× the limit",
	}
	for i, g := range r.Goals {
		if got := g.status(); got != want[i] {
			t.Errorf("goal %q: status %q, want %q", g.Goal, got, want[i])
		}
	}
	var b strings.Builder
	printGoals(&b, r.Goals, "####", nil)
	if !strings.Contains(b.String(), "| s | lower | 2.620 | 2.000 | not met, 1.31× the limit |") {
		t.Errorf("the goals table does not show the miss:\n%s", b.String())
	}
}

// The README's results part is what the committed results file writes,
// so that it shows the committed run and no figure copied by hand.
func TestReadmeShowsCommittedResults(t *testing.T) {
	r, err := readResults(committedResults)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := spliceReadme(readme, readmeResults(r))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readme, want) {
		t.Errorf("README.md's results part is not what %s writes: rewrite it with `go run . -charts %s` (make bench does)", committedResults, committedResults)
	}
}

// Asked for the etcd peer where etcd is not installed, the bench stops
// and names the package.
func TestEtcdPeerNeedsEtcdServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // redis-server is found at its Debian path
	old := etcdPaths
	etcdPaths = []string{filepath.Join(t.TempDir(), "etcd")}
	t.Cleanup(func() { etcdPaths = old })
	cfg := quickConfig()
	cfg.Etcd, cfg.Only = true, []string{"handoff2"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := run(ctx, cfg, false, "", io.Discard)
	if err == nil || !strings.Contains(err.Error(), "etcd-server") {
		t.Fatalf("want an error naming the package etcd-server, got %v", err)
	}
	t.Log(err)
}

// The fair lock's goals compare fence with a peer or a floor of the same
// run, each ratio paired per repetition: each goal reads the ratio of its
// own figures, in its direction, against its limit. The figures go
// through the functions the scenarios use, so that a ratio inverted, a
// best peer picked the wrong way, a goal on the other variant's ratio, or
// a limit or a direction changed is caught.
func TestFairLockGoalsAgainstPeersAndFloors(t *testing.T) {
	r := newResults(quickConfig())
	e := &env{cfg: r.Config}
	h := &handoff2{libs: []string{"fence"}, repMed: map[string][]float64{}, pooled: map[string][]float64{}}
	for row, gaps := range map[string][2][]float64{
		// at once; after the hold
		"PING":    {{80, 80, 80}, {150, 150, 150}},
		floorName: {{100, 200, 300}, {200, 200, 200}},
		"fence":   {{112, 224, 360}, {240, 230, 250}}, // 1.12, 1.12, 1.2; 1.2, 1.15, 1.25
	} {
		for i, m := range []string{gapAtOnce, gapAfterHold} {
			h.repMed[row+"|"+m] = gaps[i]
			h.pooled[row+"|"+m] = gaps[i]
		}
	}
	h.report(e, r.scenario("handoff2"))

	fair := r.scenario("fair")
	fairRatios(fair, map[string]*fairAgg{
		"fence":     {acq: []float64{700, 690, 710}, cpu: []float64{130, 140, 120}},
		"redislock": {acq: []float64{720, 600, 700}, cpu: []float64{40, 50, 45}},
		"redsync":   {acq: []float64{650, 730, 600}, cpu: []float64{60, 35, 50}},
	})
	fair.set("fence", "min_max", newFigure("ratio", []float64{1, 1, 1}, nil))

	parallelRatios(r.scenario("parallel"),
		map[string][]float64{"fence": {100, 100, 100}, "redislock": {90, 110, 95}, "redsync": {80, 80, 80}},
		map[string][]float64{"fence": {21.6, 22, 20}, "redislock": {20, 20, 20}},
		map[string][]float64{"fence": {19, 20, 19}, "redislock": {20, 20, 20}},
		[]string{"redislock", "redsync"})

	evaluateGoals(r)
	for _, want := range []struct {
		scn, goal       string
		measured, limit float64
		met             bool
	}{
		{"handoff2", "handoff (2 processes) ÷ the PUBLISH floor of the same run ≤ 1.15, released at once (fence/floor)", 1.12, 1.15, true},
		{"handoff2", "handoff (2 processes) ÷ the PUBLISH floor after the same idle ≤ 1.15, released after a 5ms hold (fence/floor after hold)", 1.2, 1.15, false},
		// Per repetition the best peer is 720, 730, 700.
		{"fair", "contended acquisitions/s ≥ 0.95 × the best Redis peer (fence/best of redislock, redsync)", 0.972, 0.95, true},
		// Per repetition the best peer is 40, 35, 45.
		{"fair", "lock server CPU per contended acquisition ≤ the best Redis peer's (fence/best of redislock, redsync)", 3.25, 1, false},
		{"parallel", "Redis CPU per uncontended acquire+release (4 names) ÷ redislock ≤ 1.10 (fence/redislock)", 1.08, 1.10, true},
		{"parallel", "client CPU per uncontended acquire+release (4 names) ÷ redislock ≤ 1.00 (fence/redislock)", 0.95, 1, true},
		// Per repetition the best peer is 90, 110, 95.
		{"parallel", "ops/s ≥ best peer (fence/best peer)", 1.053, 1, true},
	} {
		var got *goal
		for i := range r.Goals {
			if r.Goals[i].Scenario == want.scn && r.Goals[i].Goal == want.goal {
				got = &r.Goals[i]
			}
		}
		if got == nil {
			t.Errorf("no goal %q", want.goal)
			continue
		}
		if math.Abs(got.Measured-want.measured) > 0.0005 || got.Limit != want.limit || got.Met == nil || *got.Met != want.met {
			t.Errorf("goal %q: measured %v, limit %v, met %v; want %v, %v, %v", want.goal, got.Measured, got.Limit, fmtMet(got.Met), want.measured, want.limit, want.met)
		}
	}
}

func fmtMet(m *bool) string {
	if m == nil {
		return "not measured"
	}
	return strconv.FormatBool(*m)
}

// With the shapes scenario, the notes of the lock's cost goals give its
// ratios: fence's and each step's, in the order of shapeSteps.
func TestGoalNotesGiveShapes(t *testing.T) {
	r := newResults(quickConfig())
	parallelRatios(r.scenario("parallel"),
		map[string][]float64{"fence": {100}, "redislock": {100}},
		map[string][]float64{"fence": {22}, "redislock": {20}},
		map[string][]float64{"fence": {22}, "redislock": {20}}, []string{"redislock"})
	sh := r.scenario("shapes")
	for i, lib := range []string{"fence", "scripts", "-publish", "-queue", "-clock"} {
		sh.Ratios["client_cpu "+lib+"/redislock"] = 1.1 - 0.05*float64(i)
	}
	evaluateGoals(r)
	for _, g := range r.Goals {
		if strings.HasPrefix(g.Goal, "client CPU per uncontended") {
			want := "÷ redislock in the shapes scenario: fence 1.100, scripts 1.050, -publish 1.000, -queue 0.950, -clock 0.900"
			if !strings.Contains(g.Note, want) {
				t.Errorf("client CPU goal's note %q lacks %q", g.Note, want)
			}
			return
		}
	}
	t.Fatal("no client CPU goal")
}
