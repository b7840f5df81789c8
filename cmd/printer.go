package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"
)

// printer decides, for every command, between a human table and JSON.
// JSON field names are snake_case and stable: fields are added, never
// renamed.
type printer struct {
	Out    io.Writer
	Err    io.Writer
	format string // "table" or "json"; set from --output before RunE
	// printedJSON: a JSON document went to Out (Execute then adds no
	// error document of its own).
	printedJSON bool
}

// JSON reports whether --output json was asked for.
func (p *printer) JSON() bool { return p.format == "json" }

// PrintJSON writes v as indented JSON followed by a newline.
func (p *printer) PrintJSON(v any) error {
	p.printedJSON = true
	enc := json.NewEncoder(p.Out)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// Table writes rows under header as a plain table. An empty title prints
// none. Headers keep their case: operators grep for the exact words.
func (p *printer) Table(title string, header []string, rows [][]string) {
	t := table.NewWriter()
	t.SetOutputMirror(p.Out)
	t.SetStyle(table.StyleLight)
	t.Style().Format.Header = text.FormatDefault
	t.Style().Format.Footer = text.FormatDefault
	if title != "" {
		t.SetTitle(title)
	}
	h := make(table.Row, len(header))
	for i, c := range header {
		h[i] = c
	}
	t.AppendHeader(h)
	for _, r := range rows {
		row := make(table.Row, len(r))
		for i, c := range r {
			row[i] = c
		}
		t.AppendRow(row)
	}
	t.Render()
}

// latencyUnit is the one unit of a table column of latencies, named in
// its header, so that rows compare at a glance.
type latencyUnit struct {
	name string
	per  time.Duration
	prec int
}

// latencyUnitFor picks ms when any latency of the column reaches 10 ms
// (with a decimal more when some are under 1 ms), else µs.
func latencyUnitFor(ds []time.Duration) latencyUnit {
	lo, hi := time.Duration(0), time.Duration(0)
	for i, d := range ds {
		if i == 0 || d < lo {
			lo = d
		}
		hi = max(hi, d)
	}
	switch {
	case hi < 10*time.Millisecond:
		return latencyUnit{"µs", time.Microsecond, 0}
	case lo < time.Millisecond:
		return latencyUnit{"ms", time.Millisecond, 2}
	}
	return latencyUnit{"ms", time.Millisecond, 1}
}

func (u latencyUnit) format(d time.Duration) string {
	return fmt.Sprintf("%.*f", u.prec, float64(d)/float64(u.per))
}

func (u latencyUnit) header(name string) string { return name + " (" + u.name + ")" }
