package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/chaos"
)

// report is a small run as chaos.Run reports it: per fault kind, the loss
// detections and takeovers measured.
func report(cluster bool, lease time.Duration, loss, takeover map[string][]time.Duration) *chaos.Report {
	r := &chaos.Report{Seed: 1, Guard: true, Cluster: cluster, Lease: lease, Trials: 10, PerKind: map[string]*chaos.KindStats{}}
	for k, ds := range loss {
		r.Kinds = append(r.Kinds, k)
		r.PerKind[k] = &chaos.KindStats{Trials: 2, Faults: 2, Loss: ds, Takeover: takeover[k]}
	}
	return r
}

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

// The chart is drawn from the summaries make chaos writes (the JSON of
// chaos.Report.Summary), shows every fault kind of both runs and the
// series, and is an SVG document.
func TestChartFromSummaries(t *testing.T) {
	one := report(false, 400*time.Millisecond,
		map[string][]time.Duration{chaos.FaultRedisPause: ms(320, 350, 390), chaos.FaultFlushAll: ms(90, 95)},
		map[string][]time.Duration{chaos.FaultRedisPause: ms(700, 900), chaos.FaultFlushAll: ms(400)})
	one.PerKind[chaos.FaultPGDelay] = &chaos.KindStats{Trials: 1, Faults: 1} // nothing measured: no row of dots
	one.Kinds = append(one.Kinds, chaos.FaultPGDelay)
	cl := report(true, time.Second,
		map[string][]time.Duration{chaos.FaultClusterKill: ms(905, 980), chaos.FaultClusterLossy: ms(731)},
		map[string][]time.Duration{chaos.FaultClusterKill: ms(4950, 6210), chaos.FaultClusterLossy: ms(1110, 3580)})
	dir := t.TempDir()
	path := filepath.Join(dir, "results", "latest.json")
	if err := writeResults(path, map[string]chaos.Summary{"one_redis": one.Summary(), "cluster": cl.Summary()}); err != nil {
		t.Fatal(err)
	}
	var back map[string]chaos.Summary
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &back); err != nil || back["cluster"].Trials != 10 {
		t.Fatalf("results file does not hold the summaries: %v %+v", err, back)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "results", chartFile))
	if err != nil {
		t.Fatalf("no chart next to the results: %v", err)
	}
	if !bytes.HasPrefix(svg, []byte("<?xml")) || !bytes.Contains(svg, []byte("<svg")) {
		t.Fatalf("%s is not an SVG document", chartFile)
	}
	for _, want := range []string{
		chaos.FaultRedisPause, chaos.FaultFlushAll, chaos.FaultPGDelay, chaos.FaultClusterKill, chaos.FaultClusterLossy,
		"loss detected (Lock.Context cancelled)", "takeover (next holder's first commit)", "lease",
		"one Redis: 10 trials, lease 400 ms", "Redis Cluster, 3 masters + 3 replicas: 10 trials, lease 1000 ms",
	} {
		if !bytes.Contains(svg, []byte(">"+xmlEscape(want)+"<")) {
			t.Errorf("the chart does not show %q", want)
		}
	}
}

// Results without any measured loss or takeover are an error, not an
// empty chart.
func TestChartNeedsMeasurements(t *testing.T) {
	r := report(false, 400*time.Millisecond, map[string][]time.Duration{chaos.FaultPGDelay: nil}, nil)
	b, _ := json.Marshal(map[string]chaos.Summary{"one_redis": r.Summary()})
	err := drawChart(b, filepath.Join(t.TempDir(), chartFile))
	if err == nil || !strings.Contains(err.Error(), "no loss detection or takeover measured") {
		t.Fatalf("want an error saying nothing was measured, got %v", err)
	}
}

func xmlEscape(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
