package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The headline comparison as SVG charts, drawn from a run's results (never
// by hand): make bench writes them next to latest.json, and
// `go run . -charts results/latest.json` redraws them from a results file.
// Each chart is one file; chartFiles lists them in README order.
var chartFiles = []string{"latency.svg", "handoff.svg", "contention.svg", "guard.svg"}

// Colours of the series, the same library in the same colour everywhere.
var (
	colFloor = color.RGBA{R: 150, G: 150, B: 150, A: 255}
	colLib   = map[string]color.Color{
		"fence":         color.RGBA{R: 31, G: 119, B: 180, A: 255},
		"redsync":       color.RGBA{R: 255, G: 127, B: 14, A: 255},
		"redislock":     color.RGBA{R: 44, G: 160, B: 44, A: 255},
		"redislock-1ms": color.RGBA{R: 152, G: 223, B: 138, A: 255},
	}
	colSeries = []color.Color{
		color.RGBA{R: 31, G: 119, B: 180, A: 255},
		color.RGBA{R: 174, G: 199, B: 232, A: 255},
		color.RGBA{R: 214, G: 39, B: 40, A: 255},
	}
)

const chartW, chartH = 16 * vg.Centimeter, 8 * vg.Centimeter

// chartFont is a sans-serif face (gonum's Liberation fonts are embedded;
// the SVG names the family, which a browser without it replaces).
var chartFont = font.Font{Typeface: "Liberation", Variant: "Sans"}

// useChartFont makes the plots drawn after it use chartFont.
func useChartFont() {
	plot.DefaultFont = chartFont
	plotter.DefaultFont = chartFont
}

// drawChartsFrom reads a results file and draws its charts into dir.
func drawChartsFrom(resultsPath, dir string) error {
	b, err := os.ReadFile(resultsPath)
	if err != nil {
		return err
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %w", resultsPath, err)
	}
	return drawCharts(&r, dir)
}

// drawCharts draws the headline charts of r into dir. A chart whose
// scenario did not run (-only) is left out; a scenario that ran without a
// figure a chart needs is an error, which names it.
func drawCharts(r *results, dir string) error {
	useChartFont()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, c := range []struct {
		file, scenario string
		draw           func(*scenario, string) error
	}{
		{"latency.svg", "uncontended", drawLatency},
		{"handoff.svg", "handoff", drawHandoff},
		{"contention.svg", "contended", drawContention},
		{"guard.svg", "guard", func(s *scenario, path string) error { return drawGuard(s, r.Scenarios["sqlfence"], path) }},
	} {
		s, ok := r.Scenarios[c.scenario]
		if !ok || s.Error != "" {
			continue
		}
		if err := c.draw(s, filepath.Join(dir, c.file)); err != nil {
			return fmt.Errorf("chart %s: %w", c.file, err)
		}
	}
	return nil
}

// headline is the figure the tables show: the median over every sample
// when the scenario pooled them, else the median over repetitions.
func headline(f *figure) float64 {
	if f.Pooled != nil {
		return f.Pooled.Median
	}
	return f.Median
}

func need(s *scenario, lib, metric string) (*figure, error) {
	if f := s.get(lib, metric); f != nil {
		return f, nil
	}
	return nil, fmt.Errorf("no %s figure for %q in the results", metric, lib)
}

// peers are the libraries of s other than its baseline rows, in order.
func peers(s *scenario) []string {
	var out []string
	for _, l := range s.Libs {
		if _, ok := colLib[l]; ok {
			out = append(out, l)
		}
	}
	return out
}

func newPlot(title string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.Legend.Top = true
	p.Legend.Left = false
	p.Y.Label.TextStyle.Font.Size = vg.Points(9)
	p.X.Label.TextStyle.Font.Size = vg.Points(9)
	return p
}

// drawLatency: uncontended acquire+release, median and p99 per library,
// against two PING round trips (the least a lock and an unlock can take).
func drawLatency(s *scenario, path string) error {
	labels := []string{"2×PING (floor)"}
	floor, err := need(s, "2×PING", "latency_us")
	if err != nil {
		return err
	}
	med := plotter.Values{headline(floor)}
	p99 := plotter.Values{pooledP99(floor)}
	for _, l := range peers(s) {
		f, err := need(s, l, "latency_us")
		if err != nil {
			return err
		}
		labels = append(labels, l)
		med = append(med, headline(f))
		p99 = append(p99, pooledP99(f))
	}
	p := newPlot("Uncontended acquire + release")
	p.Y.Label.Text = "µs"
	w := vg.Points(16)
	for i, v := range []struct {
		name string
		vals plotter.Values
	}{{"median", med}, {"p99", p99}} {
		bars, err := plotter.NewBarChart(v.vals, w)
		if err != nil {
			return err
		}
		bars.Color = colSeries[i]
		bars.LineStyle.Width = 0
		bars.Offset = vg.Length(2*i-1) * w / 2
		p.Add(bars)
		p.Legend.Add(v.name, bars)
		if err := barLabels(p, bars, v.vals, "%.0f"); err != nil {
			return err
		}
	}
	p.NominalX(labels...)
	p.Y.Min, p.Y.Max = 0, 1.3*highest(p99) // room for the legend above the bars
	return p.Save(chartW, chartH, path)
}

func highest(vs ...plotter.Values) float64 {
	m := 0.0
	for _, v := range vs {
		for _, x := range v {
			m = math.Max(m, x)
		}
	}
	return m
}

func pooledP99(f *figure) float64 {
	if f.Pooled != nil {
		return f.Pooled.P99
	}
	return f.P99
}

// drawHandoff: from a release to the next holder, per library, on a log
// scale (fence's message against the peers' retry delays), against one
// PING round trip.
func drawHandoff(s *scenario, path string) error {
	rows := []dotRow{}
	if f := s.get("PING", "gap_us"); f != nil {
		rows = append(rows, dotRow{"PING (floor)", headline(f) / 1000, colFloor})
	}
	for _, l := range peers(s) {
		f, err := need(s, l, "gap_us")
		if err != nil {
			return err
		}
		rows = append(rows, dotRow{l, headline(f) / 1000, colLib[l]})
	}
	p := newPlot("Handoff: release → the waiting goroutine holds the lock (median)")
	if err := dotChart(p, rows, "ms (log scale)", fmtMs); err != nil {
		return err
	}
	return p.Save(chartW, chartH, path)
}

// drawContention: 16 goroutines on one name, the p99 wait (log scale) and
// the fairness (fewest / most acquisitions of one goroutine), side by side.
func drawContention(s *scenario, path string) error {
	var waits, fair []dotRow
	for _, l := range peers(s) {
		w, err := need(s, l, "wait_p99_ms")
		if err != nil {
			return err
		}
		f, err := need(s, l, "min_max")
		if err != nil {
			return err
		}
		waits = append(waits, dotRow{l, headline(w), colLib[l]})
		fair = append(fair, dotRow{l, headline(f), colLib[l]})
	}
	left := newPlot("16 goroutines on one name: wait p99")
	if err := dotChart(left, waits, "ms (log scale)", fmtMs); err != nil {
		return err
	}
	right := newPlot("fewest / most acquisitions per goroutine")
	right.X.Min, right.X.Max = 0, 1.15
	if err := dotChartLinear(right, fair, "1 = every waiter served in turn", func(v float64) string { return fmt.Sprintf("%.2f", v) }); err != nil {
		return err
	}
	return saveSideBySide(path, left, right)
}

// drawGuard: a guarded transaction's time as a ratio to the plain one (1),
// pgfence on loopback and through a 1 ms link, with the floor (the plain
// transaction with two prepared no-op statements: the least two statements
// more can cost), and sqlfence over pgx's driver and lib/pq.
func drawGuard(g, sq *scenario, path string) error {
	type group struct {
		label string
		s     *scenario
		key   string // ratio key suffix
	}
	groups := []group{{"pgfence, loopback", g, "direct"}, {"pgfence, 1 ms link", g, "proxied 1ms each way"}}
	if sq != nil && sq.Error == "" {
		groups = append(groups, group{"sqlfence, pgx", sq, "pgx"}, group{"sqlfence, lib/pq", sq, "postgres"})
	}
	ratio := func(gr group, variant string) (float64, bool) {
		v, ok := gr.s.Ratios[variant+"/plain "+gr.key]
		return v, ok
	}
	p := newPlot("Guarded transaction / plain transaction (median of per-repetition ratios)")
	p.Y.Label.Text = "× plain (1 = no cost)"
	w := vg.Points(14)
	for i, variant := range []string{"floor", "guarded", "guarded+key"} {
		var vals plotter.Values
		for _, gr := range groups {
			v, ok := ratio(gr, variant)
			if !ok {
				if variant == "floor" && gr.s != g {
					break // the floor variant is pgfence's
				}
				return fmt.Errorf("no ratio %q in the results", variant+"/plain "+gr.key)
			}
			vals = append(vals, v)
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = colSeries[i]
		if variant == "floor" {
			bars.Color = colFloor
		}
		bars.LineStyle.Width = 0
		bars.Offset = vg.Length(i-1) * w
		p.Add(bars)
		p.Legend.Add(variant, bars)
		if err := barLabels(p, bars, vals, "%.2f"); err != nil {
			return err
		}
	}
	one := plotter.NewFunction(func(float64) float64 { return 1 })
	one.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
	one.Color = color.Black
	p.Add(one)
	p.Legend.Add("plain", one)
	top := 0.0
	for _, gr := range groups {
		for _, v := range gr.s.Ratios {
			top = math.Max(top, v)
		}
	}
	p.Y.Min, p.Y.Max = 0, 1.45*top // room for the legend above the bars
	labels := make([]string, len(groups))
	for i, gr := range groups {
		labels[i] = gr.label
	}
	p.NominalX(labels...)
	return p.Save(chartW, chartH, path)
}

// barLabels writes each bar's value above it.
func barLabels(p *plot.Plot, bars *plotter.BarChart, vals plotter.Values, format string) error {
	xys := make(plotter.XYs, len(vals))
	labels := make([]string, len(vals))
	for i, v := range vals {
		xys[i] = plotter.XY{X: float64(i), Y: v}
		labels[i] = fmt.Sprintf(format, v)
	}
	lb, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
	if err != nil {
		return err
	}
	for j := range lb.TextStyle {
		lb.TextStyle[j].Font.Size = vg.Points(7)
		lb.TextStyle[j].XAlign = draw.XCenter
	}
	lb.Offset = vg.Point{X: bars.Offset, Y: vg.Points(2)}
	p.Add(lb)
	return nil
}

// fmtMs formats milliseconds with the digits that matter.
func fmtMs(v float64) string {
	switch {
	case v >= 10:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 1:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f ms", v)
}

// dotRow is one row of a dot chart: a label, its value, its colour.
type dotRow struct {
	label string
	value float64
	color color.Color
}

// dotChart puts one dot per row on a log-scaled x axis, labelled with its
// value: the way to compare figures that differ by orders of magnitude.
func dotChart(p *plot.Plot, rows []dotRow, xlabel string, format func(float64) string) error {
	for _, r := range rows {
		if !(r.value > 0) || math.IsInf(r.value, 0) {
			return fmt.Errorf("%s: %v cannot go on a log scale", r.label, r.value)
		}
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	lo, hi := rows[0].value, rows[0].value
	for _, r := range rows {
		lo, hi = math.Min(lo, r.value), math.Max(hi, r.value)
	}
	p.X.Min, p.X.Max = lo/3, hi*5
	return dots(p, rows, xlabel, format)
}

func dotChartLinear(p *plot.Plot, rows []dotRow, xlabel string, format func(float64) string) error {
	return dots(p, rows, xlabel, format)
}

func dots(p *plot.Plot, rows []dotRow, xlabel string, format func(float64) string) error {
	p.X.Label.Text = xlabel
	p.Legend.Top = false
	names := make([]string, len(rows))
	for i, r := range rows {
		names[i] = r.label
		sc, err := plotter.NewScatter(plotter.XYs{{X: r.value, Y: float64(i)}})
		if err != nil {
			return err
		}
		sc.GlyphStyle.Shape = draw.CircleGlyph{}
		sc.GlyphStyle.Radius = vg.Points(4)
		sc.GlyphStyle.Color = r.color
		p.Add(sc)
		lb, err := plotter.NewLabels(plotter.XYLabels{
			XYs:    plotter.XYs{{X: r.value, Y: float64(i)}},
			Labels: []string{"  " + format(r.value)},
		})
		if err != nil {
			return err
		}
		for j := range lb.TextStyle {
			lb.TextStyle[j].Font.Size = vg.Points(8)
			lb.TextStyle[j].YAlign = draw.YCenter
		}
		p.Add(lb)
	}
	p.NominalY(names...)
	p.Y.Min, p.Y.Max = -0.6, float64(len(rows))-0.4
	return nil
}

// saveSideBySide draws plots next to each other into one file, in the
// format its extension names (svg).
func saveSideBySide(path string, plots ...*plot.Plot) error {
	c, err := draw.NewFormattedCanvas(chartW, chartH, strings.TrimPrefix(filepath.Ext(path), "."))
	if err != nil {
		return err
	}
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Millimeter * 4}
	row := make([][]*plot.Plot, 1)
	row[0] = plots
	canvases := plot.Align(row, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// chartSeries lists, per chart file, the series names its SVG must show
// (for the tests: a chart that lost a series is caught).
func chartSeries(file string) []string {
	switch strings.TrimSuffix(file, ".svg") {
	case "latency":
		return []string{"2×PING (floor)", "fence", "redsync", "redislock", "median", "p99"}
	case "handoff":
		return []string{"PING (floor)", "fence", "redsync", "redislock"}
	case "contention":
		return []string{"fence", "redsync", "redislock", "16 goroutines on one name: wait p99", "fewest / most acquisitions per goroutine"}
	case "guard":
		return []string{"floor", "guarded", "guarded+key", "plain", "pgfence, loopback", "pgfence, 1 ms link"}
	}
	return nil
}
