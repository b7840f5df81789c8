package cmd

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
)

// grafanaDashboard is the part of deploy/grafana/mc.json the test reads.
type grafanaDashboard struct {
	Panels []struct {
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

var (
	promLabelLists = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promSelectors  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]|"[^"]*"`)
	promTokens     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?|[0-9][0-9.eE+-]*`)
	promKeywords   = []string{"and", "or", "unless", "bool", "offset"}
)

// metricNames are the metrics a PromQL expression reads: its identifiers
// that are not functions, keywords, label lists, selectors or numbers.
func metricNames(expr string) []string {
	e := promSelectors.ReplaceAllString(promLabelLists.ReplaceAllString(expr, ""), "")
	var out []string
	for _, tok := range promTokens.FindAllString(e, -1) {
		if tok[0] >= '0' && tok[0] <= '9' || strings.HasSuffix(tok, "(") || slices.Contains(promKeywords, strings.TrimSpace(tok)) {
			continue
		}
		out = append(out, strings.TrimSpace(tok))
	}
	return out
}

func TestMetricNames(t *testing.T) {
	got := metricNames(`sum by (instance) (rate(a_total{instance=~"$instance", status="failed"}[$__rate_interval])) / clamp_min(sum without (x) (rate(b:c{y="1e9"}[5m])), 1e-9) > bool 0 and on (z) d`)
	if want := []string{"a_total", "b:c", "d"}; !slices.Equal(got, want) {
		t.Fatalf("metricNames = %q, want %q", got, want)
	}
}

// Every metric mc's Grafana dashboard (deploy/grafana/mc.json) queries
// is exported by the process its row names, so the dashboard cannot rot:
// a renamed or dropped metric fails here.
func TestGrafanaDashboardMetricsExported(t *testing.T) {
	isolateEnv(t)
	b, err := os.ReadFile("../deploy/grafana/mc.json")
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("mc.json: %v", err)
	}
	// Metric names by the process that must export them, from the rows.
	want := map[string][]string{}
	row := ""
	for _, p := range d.Panels {
		if p.Type == "row" {
			row = p.Title
			continue
		}
		if row == "" || len(p.Targets) == 0 {
			t.Fatalf("panel %q: not under a row, or no query", p.Title)
		}
		for _, tg := range p.Targets {
			names := metricNames(tg.Expr)
			if len(names) == 0 {
				t.Errorf("panel %q: no metric in %q", p.Title, tg.Expr)
			}
			want[row] = append(want[row], names...)
		}
	}

	// mc bench initiator --metrics-listen, over soft RDMA NICs: the
	// transfer engine and the RDMA endpoint store.
	port := strconv.Itoa(freePort(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Execute(ctx, []string{"bench", "initiator", "--protocol", "rdma", "--device-name", "soft0,soft1", "--threads", "1",
			"--batch-size", "8", "--block-size", "64K", "--duration", "20", "--metrics-listen", "127.0.0.1:" + port}, &out, &out)
	}()
	initiator := scrapeUntil(t, "http://127.0.0.1:"+port+"/metrics", "mc_engine_tasks_total", done, &out)
	cancel()
	<-done

	// mc serve store as an HA master candidate with a segment: the store.
	e, err := meta.StartEtcd(context.Background(), meta.EtcdConfig{Listen: "127.0.0.1:0", NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	t.Setenv("MC_STORE_CLUSTER_ID", "dashboard")
	_, admin, sout, _ := startServeStore(t, "--enable_ha", "--ha_backend_connstring", "etcd://"+e.Endpoints()[0], "--segment-size", "8M")
	store := scrapeUntil(t, admin+"/metrics", "segment_total_capacity_bytes", nil, sout)

	exporters := map[string]map[string]string{
		"Transfer engine":             initiator,
		"RDMA endpoint store per NIC": initiator,
		"KV-cache store":              store,
	}
	for row, names := range want {
		var got map[string]string
		for prefix, scraped := range exporters {
			if strings.HasPrefix(row, prefix) {
				got = scraped
			}
		}
		if got == nil {
			t.Errorf("row %q names no process this test knows", row)
			continue
		}
		for _, n := range names {
			if _, ok := got[n]; !ok {
				t.Errorf("row %q: %s is not exported", row, n)
			}
		}
	}
}

// scrapeUntil reads url until its page has the metric want (a process
// registers some metrics only once it is under way) and returns every
// family's type by name. done and out, when given, are the process's
// exit and output, to fail early when it stops.
func scrapeUntil(t *testing.T, url, want string, done chan int, out *syncBuffer) map[string]string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		types, _, err := tryScrape(url)
		if err == nil && types[want] != "" {
			return types
		}
		select {
		case code := <-done:
			t.Fatalf("exited %d before %s showed %s:\n%s", code, url, want, out.String())
		default:
		}
		if time.Now().After(deadline) {
			msg := ""
			if out != nil {
				msg = out.String()
			}
			t.Fatalf("%s has no %s after 20 s (last error %v):\n%s", url, want, err, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
