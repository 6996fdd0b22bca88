package main

import (
	"math"
	"slices"
	"time"
)

// dist summarises samples: the median and the 99th percentile (nearest rank).
type dist struct {
	Median float64 `json:"median"`
	P99    float64 `json:"p99"`
	N      int     `json:"n"`
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	// Nearest rank: the smallest sample with at least q of the samples at
	// or below it.
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

func summarize(xs []float64) dist {
	s := slices.Clone(xs)
	slices.Sort(s)
	return dist{Median: quantile(s, 0.5), P99: quantile(s, 0.99), N: len(s)}
}

func median(xs []float64) float64 { return summarize(xs).Median }

// us converts a duration to microseconds.
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// figure is one measured quantity: the per-repetition values (each itself a
// median or a rate of that repetition), and their median and p99 across
// repetitions. When pooled samples exist (latencies), Pooled holds their
// median/p99 over every sample of every repetition.
type figure struct {
	Unit   string    `json:"unit"`
	Reps   []float64 `json:"reps"`
	Median float64   `json:"median"`
	P99    float64   `json:"p99"`
	Pooled *dist     `json:"pooled,omitempty"`
}

func newFigure(unit string, reps []float64, pooled []float64) *figure {
	d := summarize(reps)
	f := &figure{Unit: unit, Reps: reps, Median: d.Median, P99: d.P99}
	if len(pooled) > 0 {
		p := summarize(pooled)
		f.Pooled = &p
	}
	return f
}

// pairedRatio is the median over repetitions of a[i]/b[i]: each ratio
// compares two figures measured in the same repetition, interleaved.
func pairedRatio(a, b []float64) float64 {
	n := min(len(a), len(b))
	rs := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		if b[i] != 0 && !math.IsNaN(a[i]) && !math.IsNaN(b[i]) {
			rs = append(rs, a[i]/b[i])
		}
	}
	if len(rs) == 0 {
		return math.NaN()
	}
	return median(rs)
}
