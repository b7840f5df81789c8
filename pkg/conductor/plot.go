package conductor

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// WriteLoadCSV writes the sampled load of each run as CSV:
// scheduler,rejection,time_s,prefill_load,decode_load.
func WriteLoadCSV(w io.Writer, rs []Result) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"scheduler", "rejection", "time_s", "prefill_load", "decode_load"}); err != nil {
		return err
	}
	for _, r := range rs {
		for _, l := range r.Load {
			if err := cw.Write([]string{r.Scheduler, r.Rejection, strconv.FormatFloat(l.T.Seconds(), 'f', 1, 64),
				strconv.FormatFloat(l.Prefill, 'f', 4, 64), strconv.FormatFloat(l.Decode, 'f', 4, 64)}); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// PlotLoad draws, one panel per run, prefill and decode load over time
// (the paper's Figures 9 and 10), as SVG.
func PlotLoad(w io.Writer, rs []Result) error {
	if len(rs) == 0 {
		return fmt.Errorf("plot: no run to draw")
	}
	c := vgsvg.New(10*vg.Inch, vg.Length(len(rs))*3*vg.Inch)
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: len(rs), Cols: 1, PadX: vg.Inch / 4, PadY: vg.Inch / 4, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	for i, r := range rs {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s, rejection %s: decode load %.2f ± %.2f", r.Scheduler, r.Rejection, r.DecodeLoadMean, r.DecodeLoadSwing)
		p.X.Label.Text = "time (s)"
		p.Y.Label.Text = "load (1 = at the SLO)"
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		var pre, dec plotter.XYs
		for _, l := range r.Load {
			pre = append(pre, plotter.XY{X: l.T.Seconds(), Y: l.Prefill})
			dec = append(dec, plotter.XY{X: l.T.Seconds(), Y: l.Decode})
		}
		if len(pre) == 0 {
			return fmt.Errorf("plot: run %s/%s has no load samples", r.Scheduler, r.Rejection)
		}
		lp, err := plotter.NewLine(pre)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		ld, err := plotter.NewLine(dec)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		lp.Color = plotter.DefaultLineStyle.Color
		ld.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		p.Add(lp, ld)
		p.Legend.Add("prefill", lp)
		p.Legend.Add("decode", ld)
		p.Legend.Top = true
		p.Draw(tiles.At(dc, 0, i))
	}
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("plot: write svg: %w", err)
	}
	return nil
}
