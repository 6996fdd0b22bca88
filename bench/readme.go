package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The results part of bench/README.md is written from the committed
// results (results/latest.json) by make bench, between these markers, so
// that the README shows the committed run and no figure copied by hand.
const (
	readmeBegin = "<!-- results: written by make bench from results/latest.json; do not edit by hand -->"
	readmeEnd   = "<!-- end of results -->"
	// committedResults is the results file the README shows.
	committedResults = "results/latest.json"
)

// readmeResults is the README's results part for r.
func readmeResults(r *results) string {
	var b strings.Builder
	pl := r.Placement
	fmt.Fprintf(&b, "From the committed run ([results/latest.json](results/latest.json), every table in [results/latest.md](results/latest.md)): %s, %s, %d CPUs, pinned=%v (servers on CPUs %v, the bench and its child processes on %v, GOMAXPROCS=%d), load average %s at the start and %s at the end; Redis %s, Postgres %s",
		r.Started.Format("2006-01-02 15:04 UTC"), pl.CPUModel, pl.NumCPU, pl.Pinned, pl.RedisCPUs, pl.ClientCPUs, pl.GOMAXPROCS, pl.LoadAvgStart, pl.LoadAvgEnd, pl.RedisVersion, pl.PostgresVer)
	if pl.EtcdVersion != "" {
		fmt.Fprintf(&b, ", etcd %s", pl.EtcdVersion)
	}
	fmt.Fprintf(&b, ", %s; %d repetitions.\n\n", pl.GoVersion, r.Config.Reps)
	printHeadline(&b, r)
	printFairLock(&b, r)
	printShapes(&b, r)
	met, total := 0, 0
	for _, g := range r.Goals {
		total++
		if g.Met != nil && *g.Met {
			met++
		}
	}
	fmt.Fprintf(&b, "The goals of the fair lock and of the outbox, each measured, and by how much a missed one is missed (the measured value as a multiple of its limit); %d of all %d goals of the run are met, latest.md lists the others:\n\n", met, total)
	printGoals(&b, r.Goals, "####", []string{issueFair, issueOutbox})
	return strings.TrimRight(b.String(), "\n") + "\n"
}

// spliceReadme returns readme with its results part replaced by part.
func spliceReadme(readme []byte, part string) ([]byte, error) {
	i := bytes.Index(readme, []byte(readmeBegin))
	j := bytes.Index(readme, []byte(readmeEnd))
	if i < 0 || j < i {
		return nil, fmt.Errorf("README.md has no results part: put the lines %q and %q where it goes", readmeBegin, readmeEnd)
	}
	var out bytes.Buffer
	out.Write(readme[:i+len(readmeBegin)])
	out.WriteString("\n\n" + part + "\n")
	out.Write(readme[j:])
	return out.Bytes(), nil
}

// writeReadme rewrites the results part of the README next to the results
// directory, when resultsPath is the committed results file.
func writeReadme(resultsPath string, r *results) error {
	if filepath.Clean(resultsPath) != filepath.Clean(committedResults) {
		return nil
	}
	path := filepath.Join(filepath.Dir(resultsPath), "..", "README.md")
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	b, err := spliceReadme(old, readmeResults(r))
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func readResults(path string) (*results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// deriveFrom draws the charts of a results file next to it and, for the
// committed one, rewrites the README's results part: what make bench
// derives from its results, again.
func deriveFrom(path string, log io.Writer) error {
	r, err := readResults(path)
	if err != nil {
		return err
	}
	if err := drawCharts(r, filepath.Dir(path)); err != nil {
		return err
	}
	if err := writeReadme(path, r); err != nil {
		return err
	}
	logf(log, "drew the charts of %s at %s", path, time.Now().UTC().Format(time.RFC3339))
	return nil
}
