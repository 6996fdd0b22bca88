package main

import (
	"bytes"
	"context"
	"io"
	"math"
	"os"
	"path/filepath"
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
