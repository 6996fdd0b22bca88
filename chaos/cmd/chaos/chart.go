package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/fencelock/fencelock/chaos"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// chartFile is the chart make chaos draws next to its results: per fault
// kind, how soon the holders the fault hit learned they lost the lock,
// and how soon the next holder committed, drawn from the run's summary.
const chartFile = "faults.svg"

// runLabels names the runs of a summary, in the order they are drawn.
var runLabels = []struct{ key, title string }{
	{"one_redis", "one Redis"},
	{"cluster", "Redis Cluster, 3 masters + 3 replicas"},
}

var (
	colLoss     = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	colTakeover = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	chartFont   = font.Font{Typeface: "Liberation", Variant: "Sans"}
)

// summaryKind is what the chart reads of a fault kind in a run's summary.
type summaryKind struct {
	Trials   int      `json:"trials"`
	Loss     durStats `json:"loss_detection_ms"`
	Takeover durStats `json:"takeover_ms"`
}

type durStats struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
}

type summaryRun struct {
	LeaseMS int64                  `json:"lease_ms"`
	Trials  int                    `json:"trials"`
	PerKind map[string]summaryKind `json:"per_kind"`
}

// writeResults writes the run's summaries (the last line of its output) to
// path, and the chart drawn from that file next to it.
func writeResults(path string, summary map[string]chaos.Summary) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(summary, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return drawChart(b, filepath.Join(filepath.Dir(path), chartFile))
}

// drawChart draws the loss-detection and takeover chart of a results
// document (a JSON object of run summaries) into path (svg).
func drawChart(results []byte, path string) error {
	var runs map[string]summaryRun
	if err := json.Unmarshal(results, &runs); err != nil {
		return fmt.Errorf("chaos results: %w", err)
	}
	plot.DefaultFont, plotter.DefaultFont = chartFont, chartFont
	var plots []*plot.Plot
	for _, rl := range runLabels {
		run, ok := runs[rl.key]
		if !ok {
			continue
		}
		p, err := runPlot(rl.title, run)
		if err != nil {
			return fmt.Errorf("chaos chart, %s: %w", rl.title, err)
		}
		plots = append(plots, p)
	}
	if len(plots) == 0 {
		return fmt.Errorf("chaos chart: the results hold none of the runs %s", runKeys())
	}
	width, height := 16*vg.Centimeter, 9*vg.Centimeter
	c, err := draw.NewFormattedCanvas(width*vg.Length(len(plots)), height, strings.TrimPrefix(filepath.Ext(path), "."))
	if err != nil {
		return err
	}
	row := [][]*plot.Plot{plots}
	canvases := plot.Align(row, draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Centimeter}, draw.New(c))
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

func runKeys() string {
	keys := make([]string, len(runLabels))
	for i, rl := range runLabels {
		keys[i] = rl.key
	}
	return strings.Join(keys, ", ")
}

// runPlot draws one run: a row per fault kind, the median of each measure
// as a dot and a line from it to the p95, on a log scale, with the lease.
func runPlot(title string, run summaryRun) (*plot.Plot, error) {
	kinds := orderedKinds(run.PerKind)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: %d trials, lease %d ms", title, run.Trials, run.LeaseMS)
	p.Title.TextStyle.Font.Size = vg.Points(10)
	p.X.Label.Text = "ms after the fault (log scale): dot p50, line to p95"
	p.X.Label.TextStyle.Font.Size = vg.Points(8)
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	lo, hi := math.Inf(1), 0.0
	names := make([]string, len(kinds))
	var legendLoss, legendTake plot.Thumbnailer
	for i, k := range kinds {
		names[i] = k
		st := run.PerKind[k]
		for _, m := range []struct {
			d      durStats
			dy     float64
			col    color.Color
			legend *plot.Thumbnailer
		}{{st.Loss, 0.15, colLoss, &legendLoss}, {st.Takeover, -0.15, colTakeover, &legendTake}} {
			if m.d.N == 0 || !(m.d.P50 > 0) {
				continue // not measured for this kind (no holder lost its lock, say)
			}
			y := float64(i) + m.dy
			ln, err := plotter.NewLine(plotter.XYs{{X: m.d.P50, Y: y}, {X: math.Max(m.d.P95, m.d.P50), Y: y}})
			if err != nil {
				return nil, err
			}
			ln.Color, ln.Width = m.col, vg.Points(1.5)
			dot, err := plotter.NewScatter(plotter.XYs{{X: m.d.P50, Y: y}})
			if err != nil {
				return nil, err
			}
			dot.GlyphStyle = draw.GlyphStyle{Color: m.col, Radius: vg.Points(3), Shape: draw.CircleGlyph{}}
			p.Add(ln, dot)
			*m.legend = dot
			lo, hi = math.Min(lo, m.d.P50), math.Max(hi, math.Max(m.d.P95, m.d.P50))
		}
	}
	if hi == 0 {
		return nil, fmt.Errorf("no loss detection or takeover measured for any fault kind")
	}
	if legendLoss != nil {
		p.Legend.Add("loss detected (Lock.Context cancelled)", legendLoss)
	}
	if legendTake != nil {
		p.Legend.Add("takeover (next holder's first commit)", legendTake)
	}
	if run.LeaseMS > 0 {
		lease := float64(run.LeaseMS)
		ln, err := plotter.NewLine(plotter.XYs{{X: lease, Y: -0.5}, {X: lease, Y: float64(len(kinds)) - 0.5}})
		if err != nil {
			return nil, err
		}
		ln.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		p.Add(ln)
		p.Legend.Add("lease", ln)
		lo, hi = math.Min(lo, lease), math.Max(hi, lease)
	}
	p.X.Min, p.X.Max = lo/2, hi*4
	p.NominalY(names...)
	p.Y.Min, p.Y.Max = -0.6, float64(len(kinds))+1.2 // room for the legend
	return p, nil
}

// orderedKinds lists the kinds of a run in report order, unknown ones
// last (sorted), so that the chart reads like the run's table.
func orderedKinds(per map[string]summaryKind) []string {
	rank := map[string]int{}
	for i, k := range append(append([]string{}, chaos.FaultKinds...), chaos.ClusterFaultKinds...) {
		rank[k] = i
	}
	kinds := make([]string, 0, len(per))
	for k := range per {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		ri, iok := rank[kinds[i]]
		rj, jok := rank[kinds[j]]
		switch {
		case iok && jok:
			return ri > rj // NominalY draws the first name at the bottom
		case iok != jok:
			return jok
		}
		return kinds[i] > kinds[j]
	})
	return kinds
}
