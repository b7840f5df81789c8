package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"

	ebench "github.com/kvcache-ops/mc/pkg/engine/bench"
)

// Plot draws how cost grows with concurrency: objects/s and p99 call
// latency against concurrency (log2 axis), one line per value size and
// op, side by side, as SVG.
func Plot(w io.Writer, rs []Result) error {
	if len(rs) == 0 {
		return fmt.Errorf("plot: no result to draw")
	}
	type key struct {
		size int64
		op   string
	}
	var order []key
	lines := map[key][2]plotter.XYs{}
	ticks := map[int]bool{}
	for _, r := range rs {
		k := key{r.ValueSize, r.Op}
		if _, ok := lines[k]; !ok {
			order = append(order, k)
		}
		l := lines[k]
		x := math.Log2(float64(r.Concurrency))
		l[0] = append(l[0], plotter.XY{X: x, Y: r.OpsPerSec})
		l[1] = append(l[1], plotter.XY{X: x, Y: r.P99us / 1e3})
		lines[k] = l
		ticks[r.Concurrency] = true
	}
	var tk []plot.Tick
	for c := range ticks {
		tk = append(tk, plot.Tick{Value: math.Log2(float64(c)), Label: strconv.Itoa(c)})
	}
	mk := func(ylabel string, idx int) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("mc bench store, batch %d", rs[0].Batch)
		p.X.Label.Text = "concurrency"
		p.Y.Label.Text = ylabel
		p.X.Tick.Marker = plot.ConstantTicks(tk)
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		for i, k := range order {
			pts := lines[k][idx]
			l, s, err := plotter.NewLinePoints(pts)
			if err != nil {
				return nil, fmt.Errorf("plot: %w", err)
			}
			l.Color = plotutil.Color(i)
			s.Color = l.Color
			p.Add(l, s)
			p.Legend.Add(ebench.FormatSize(k.size)+" "+k.op, l)
		}
		p.Legend.Top, p.Legend.Left = true, true
		if len(tk) == 1 {
			p.X.Min, p.X.Max = tk[0].Value-1, tk[0].Value+1
		}
		return p, nil
	}
	left, err := mk("objects/s", 0)
	if err != nil {
		return err
	}
	right, err := mk("p99 call latency (ms)", 1)
	if err != nil {
		return err
	}
	return ebench.SideBySide(w, left, right)
}
