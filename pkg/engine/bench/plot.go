package bench

import (
	"fmt"
	"io"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// PlotSweep draws a sweep as curves, side by side: throughput (in unit)
// and p99 batch latency against block size on a log2 axis, and writes the
// SVG to w. Sweeps are read as curves: where throughput flattens and where
// latency takes off.
func PlotSweep(w io.Writer, rs []Result, unit Unit) error {
	if len(rs) == 0 {
		return fmt.Errorf("plot: no result to draw")
	}
	var tput, p99 plotter.XYs
	var ticks []plot.Tick
	for _, r := range rs {
		x := math.Log2(float64(r.BlockSize))
		tput = append(tput, plotter.XY{X: x, Y: unit.Per(r.BytesPerSec)})
		p99 = append(p99, plotter.XY{X: x, Y: float64(r.LatencyP99) / 1e3})
		ticks = append(ticks, plot.Tick{Value: x, Label: FormatSize(r.BlockSize)})
	}
	threads := "threads"
	if rs[0].Threads == 1 {
		threads = "thread"
	}
	title := fmt.Sprintf("%s, %d %s, batch %d", rs[0].Operation, rs[0].Threads, threads, rs[0].BatchSize)
	left, err := curve(title, unit.Name+"/s", tput, ticks)
	if err != nil {
		return err
	}
	right, err := curve(title, "p99 batch latency (µs)", p99, ticks)
	if err != nil {
		return err
	}
	return SideBySide(w, left, right)
}

// SideBySide writes two plots next to each other as one SVG (mc's
// throughput-and-latency figures).
func SideBySide(w io.Writer, left, right *plot.Plot) error {
	c := vgsvg.New(12*vg.Inch, 4.5*vg.Inch)
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Inch / 4, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	left.Draw(tiles.At(dc, 0, 0))
	right.Draw(tiles.At(dc, 1, 0))
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("plot: write svg: %w", err)
	}
	return nil
}

func curve(title, ylabel string, pts plotter.XYs, ticks []plot.Tick) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "block size"
	p.Y.Label.Text = ylabel
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	l, s, err := plotter.NewLinePoints(pts)
	if err != nil {
		return nil, fmt.Errorf("plot: %w", err)
	}
	p.Add(l, s)
	// One point: widen the axis so it is not degenerate.
	if len(pts) == 1 {
		p.X.Min, p.X.Max = pts[0].X-1, pts[0].X+1
	}
	return p, nil
}
