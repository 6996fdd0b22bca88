package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// checkCharts checks that dir holds every headline chart as an SVG that
// shows each of its series.
func checkCharts(t *testing.T, dir string) {
	t.Helper()
	for _, name := range chartFiles {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("chart %s was not drawn: %v", name, err)
			continue
		}
		if !bytes.HasPrefix(b, []byte("<?xml")) || !bytes.Contains(b, []byte("<svg")) {
			t.Errorf("%s is not an SVG document", name)
		}
		for _, series := range chartSeries(name) {
			if !bytes.Contains(b, []byte(">"+series+"<")) {
				t.Errorf("%s does not show the series %q", name, series)
			}
		}
	}
}

// The charts of the committed run are drawn from its results file.
func TestChartsFromCommittedResults(t *testing.T) {
	dir := t.TempDir()
	if err := drawChartsFrom(filepath.Join("results", "latest.json"), dir); err != nil {
		t.Fatal(err)
	}
	checkCharts(t, dir)
}

// The charts committed in results/ are the ones its latest.json draws, so
// that the README shows the committed run and nothing drawn by hand.
func TestCommittedChartsMatchResults(t *testing.T) {
	dir := t.TempDir()
	if err := drawChartsFrom(filepath.Join("results", "latest.json"), dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range chartFiles {
		want, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("results", name))
		if err != nil {
			t.Errorf("results/%s is missing: draw it with `go run . -charts results/latest.json`", name)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("results/%s is not what results/latest.json draws: redraw it with `go run . -charts results/latest.json` (make bench does)", name)
		}
	}
}

// A results file without a figure a chart needs is an error naming it,
// not a chart with a series missing.
func TestChartsNameAMissingFigure(t *testing.T) {
	r := &results{Scenarios: map[string]*scenario{}}
	s := r.scenario("uncontended")
	s.set("2×PING", "latency_us", newFigure("µs", []float64{160}, nil))
	s.set("fence", "other_metric", newFigure("µs", []float64{240}, nil))
	s.Libs = []string{"2×PING", "fence"}
	err := drawCharts(r, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "latency_us") || !strings.Contains(err.Error(), "fence") {
		t.Fatalf("want an error naming the missing latency_us of fence, got %v", err)
	}
}
