package cmd

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvcache-ops/mc/pkg/engine/meta"
	"github.com/kvcache-ops/mc/pkg/topo"
)

// newTopoCmd is the NIC topology group: the priority matrix Mooncake's
// transfer engine consumes, and why it is what it is.
func newTopoCmd(p *printer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topo",
		Short: "NIC topology: discover the NIC priority matrix and explain it",
		Long: `topo builds and inspects the NIC priority matrix of Mooncake's transfer
engine (--nic_priority_matrix): for each memory location (cpu:<numa node>,
cuda:<gpu>, hip:<gpu>) the NICs to prefer and the NICs usable on failure.`,
	}
	cmd.AddCommand(newTopoDiscoverCmd(p), newTopoShowCmd(p))
	return cmd
}

type topoDiscoverOptions struct {
	SysfsRoot       string
	IncludeInactive bool
	Filters         []string
	Write           string
}

func newTopoDiscoverCmd(p *printer) *cobra.Command {
	var o topoDiscoverOptions
	cmd := &cobra.Command{
		Use:   "discover",
		Short: "Build the NIC priority matrix from sysfs, with the PCIe relation behind each choice",
		Long: `discover reads RDMA NICs, GPUs and NUMA nodes from sysfs (no verbs, no CUDA)
and builds the matrix Mooncake would: cpu:N prefers the NICs on NUMA node N;
a GPU prefers, among the NICs on its NUMA node (all NICs if none), those of
the closest PCIe relation class; every other NIC is accessible.

Classes, closest first: PIX (same PCIe switch), PXB (several bridges, one
root port), PHB (same host bridge), NODE (same NUMA node), SYS (across
sockets, or NUMA node unknown). GPUs are numbered in PCI bus order
(CUDA_DEVICE_ORDER=PCI_BUS_ID). Only NICs with an ACTIVE port that has a GID
are used unless --include-inactive. Fallbacks taken (numa_node -1, garbage
files) are printed as notes on stderr.

--output json prints exactly the matrix, a file Mooncake loads with
--nic_priority_matrix; --write FILE saves it as well (an empty one, no NIC
found, is not written: exit 1).`,
		Example: `  mc topo discover
  mc topo discover -o json --write /etc/mooncake/nic_priority.json
  MC_TE_FILTERS=mlx5_0,mlx5_1 mc topo discover
  mc topo discover --sysfs-root /host`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTopoDiscover(cmd.Context(), o, p)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.SysfsRoot, "sysfs-root", "/", "directory that contains sys/ (a container's view of the host, a fixture tree)")
	f.BoolVar(&o.IncludeInactive, "include-inactive", false, "also use NICs without an ACTIVE port")
	f.StringSliceVar(&o.Filters, "filter", nil, "use only these NICs (comma separated; env MC_TE_FILTERS)")
	f.StringVar(&o.Write, "write", "", "also write the matrix to `FILE` (for --nic_priority_matrix)")
	envName(f, "filter", "MC_TE_FILTERS")
	_ = cmd.MarkFlagDirname("sysfs-root")
	_ = cmd.MarkFlagFilename("write", "json")
	return cmd
}

func runTopoDiscover(_ context.Context, o topoDiscoverOptions, p *printer) error {
	fsys, err := topo.NewFS(o.SysfsRoot)
	if err != nil {
		return fmt.Errorf("topo discover: %w", err)
	}
	t, err := topo.Discover(fsys, topo.Options{IncludeInactive: o.IncludeInactive, Filters: o.Filters})
	if err != nil {
		return fmt.Errorf("topo discover: %w", err)
	}
	if err := filterMatches(o.Filters, t.NICs); err != nil {
		return err
	}
	file, err := t.Matrix().MarshalFile()
	if err != nil {
		return fmt.Errorf("topo discover: %w", err)
	}
	// An empty matrix is an answer to print, but not a file to install:
	// an engine loading it has no NIC to use.
	empty := len(t.Matrix()) == 0
	if o.Write != "" && empty && p.JSON() {
		// One JSON document on stdout: the error's, not an empty
		// matrix followed by it.
		for _, n := range t.Notes {
			fmt.Fprintf(p.Err, "note: %s\n", n)
		}
		return fmt.Errorf("topo discover: no RDMA NIC found: did not write an empty matrix to %s (an engine loading it would have no NIC to use)", o.Write)
	}
	if o.Write != "" && !empty {
		if err := writeFileAtomic(o.Write, file); err != nil {
			return fmt.Errorf("topo discover: write matrix: %w", err)
		}
	}
	if p.JSON() {
		if _, err := p.Out.Write(file); err != nil {
			return fmt.Errorf("write json: %w", err)
		}
	} else {
		printDiscovered(p, t)
	}
	for _, n := range t.Notes {
		fmt.Fprintf(p.Err, "note: %s\n", n)
	}
	if o.Write != "" {
		if empty {
			return fmt.Errorf("topo discover: no RDMA NIC found: did not write an empty matrix to %s (an engine loading it would have no NIC to use)", o.Write)
		}
		fmt.Fprintf(p.Err, "wrote the priority matrix to %s\n", o.Write)
	}
	return nil
}

// filterMatches refuses a NIC filter none of whose names is a NIC here:
// a typo in it left every NIC out and printed an empty matrix, exit 0.
// Names that match nothing beside ones that do are notes (discover's).
func filterMatches(filters []string, nics []topo.NIC) error {
	var names []string
	for _, f := range filters {
		if f = strings.TrimSpace(f); f != "" {
			names = append(names, f)
		}
	}
	if len(names) == 0 || len(nics) == 0 {
		return nil
	}
	have := make([]string, 0, len(nics))
	for _, n := range nics {
		if slices.Contains(names, n.Name) {
			return nil
		}
		have = append(have, n.Name)
	}
	return usagef("--filter (or MC_TE_FILTERS) %s: no RDMA NIC here has that name (the NICs: %s)", strings.Join(names, ","), strings.Join(have, ", "))
}

const topoLegend = `PIX same PCIe switch, PXB several PCIe bridges, PHB same host bridge, NODE same NUMA node,
SYS across NUMA nodes or unknown. * preferred NIC (first list), (..) NIC not used (see NICs).
cuda:N and hip:N number GPUs in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID).`

// printDiscovered prints locations against NICs, like nvidia-smi topo -m,
// then the port facts.
func printDiscovered(p *printer, t *topo.Topology) {
	header := []string{"location", "pci", "numa"}
	for _, n := range t.NICs {
		header = append(header, n.Name)
	}
	header = append(header, "why")
	gpuPCI := map[string]string{}
	for _, g := range t.GPUs {
		gpuPCI[g.Key] = g.PCIAddress
	}
	var rows [][]string
	for _, l := range t.Locations {
		pci := gpuPCI[l.Key]
		if pci == "" {
			pci = "-"
		}
		row := []string{l.Key, pci, strconv.Itoa(l.NUMANode)}
		for _, n := range t.NICs {
			cell := l.Relations[n.Name].String()
			switch {
			case !n.Used:
				cell = "(" + cell + ")"
			case slices.Contains(l.Preferred, n.Name):
				cell += "*"
			}
			row = append(row, cell)
		}
		rows = append(rows, append(row, l.Reason))
	}
	p.Table("NIC priority matrix", header, rows)
	fmt.Fprintln(p.Out, topoLegend)
	if len(t.NICs) == 0 {
		return
	}
	fmt.Fprintln(p.Out)

	rows = rows[:0]
	for _, n := range t.NICs {
		used := "yes"
		if !n.Used {
			used = "no: " + n.UnusedReason
		}
		pci := orDash(n.PCIAddress)
		if len(n.Ports) == 0 {
			rows = append(rows, []string{n.Name, pci, strconv.Itoa(n.NUMANode), "-", "-", "-", "-", "-", "-", used})
			continue
		}
		for i, pt := range n.Ports {
			name, numa := n.Name, strconv.Itoa(n.NUMANode)
			if i > 0 {
				name, pci, numa, used = "", "", "", ""
			}
			rows = append(rows, []string{name, pci, numa, strconv.Itoa(pt.Port), orDash(pt.State), orDash(pt.PhysState),
				orDash(pt.LinkLayer), orDash(pt.Rate), orDash(pt.Netdev), used})
		}
	}
	p.Table("NICs", []string{"nic", "pci", "numa", "port", "state", "phys state", "link layer", "rate", "netdev", "used"}, rows)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

type topoShowOptions struct {
	Segment        string
	MetadataServer string
	ClusterID      string
}

func newTopoShowCmd(p *printer) *cobra.Command {
	var o topoShowOptions
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Print the priority matrix and devices a live segment published",
		Long: `show fetches a segment descriptor from the metadata server (etcd, HTTP or
P2PHANDSHAKE, as Mooncake's --metadata_server) and prints the NIC priority
matrix and RDMA devices it published, whether a Mooncake process or mc
registered it. --output json prints exactly the matrix, loadable with
--nic_priority_matrix.`,
		Example: `  mc topo show --segment prefill-0 --metadata_server 10.0.0.1:2379
  mc topo show --segment prefill-0 --metadata_server http://10.0.0.1:8080/metadata -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTopoShow(cmd.Context(), o, p)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Segment, "segment", "", "segment name (a Mooncake local_server_name; host:port with P2PHANDSHAKE)")
	f.StringVar(&o.MetadataServer, "metadata-server", "", "metadata server: host:port (etcd), etcd://h:p;h:p, http://host:port/path or P2PHANDSHAKE")
	f.StringVar(&o.ClusterID, "metadata-cluster-id", "", "metadata key prefix mooncake/<id>/ (also --cluster-id)")
	envName(f, "metadata-cluster-id", "MC_METADATA_CLUSTER_ID")
	return cmd
}

func runTopoShow(ctx context.Context, o topoShowOptions, p *printer) error {
	if o.Segment == "" {
		return usagef("topo show: --segment is required")
	}
	if o.MetadataServer == "" {
		return usagef("topo show: --metadata-server is required")
	}
	if err := checkMetadataServer("metadata-server", o.MetadataServer); err != nil {
		return err
	}
	b, err := meta.Open(ctx, o.MetadataServer, meta.Options{ClusterID: o.ClusterID, HTTPToken: metadataToken()})
	if err != nil {
		return fmt.Errorf("topo show: %w", err)
	}
	defer b.Close()
	d, err := b.GetSegment(ctx, o.Segment)
	if err != nil {
		return fmt.Errorf("topo show: %w", err)
	}
	m := d.PriorityMatrix
	if m == nil {
		m = topo.Matrix{}
	}
	if p.JSON() {
		file, err := m.MarshalFile()
		if err != nil {
			return fmt.Errorf("topo show: %w", err)
		}
		if _, err := p.Out.Write(file); err != nil {
			return fmt.Errorf("write json: %w", err)
		}
	} else if len(m) == 0 && len(d.Devices) == 0 {
		printSegmentNoNICs(p, d)
		return nil
	} else {
		printSegmentTopo(p, d, m)
	}
	if len(m) == 0 {
		fmt.Fprintf(p.Err, "note: segment %q (protocol %s) published no priority matrix\n", d.Name, d.Protocol)
	}
	devs := map[string]bool{}
	for _, dev := range d.Devices {
		devs[dev.Name] = true
	}
	for _, n := range m.NICs() {
		if !devs[n] {
			fmt.Fprintf(p.Err, "note: the matrix names %s, which segment %q does not publish as a device\n", n, d.Name)
		}
	}
	return nil
}

// printSegmentNoNICs speaks for a segment without NICs (a TCP one) instead
// of printing two empty tables.
func printSegmentNoNICs(p *printer, d *meta.SegmentDesc) {
	fmt.Fprintln(p.Out, segmentLine(d))
	if d.Protocol == "tcp" {
		fmt.Fprintf(p.Out, "a TCP segment has no NIC priority matrix and no RDMA devices: its buffers are served on TCP data port %d\n", d.TCPDataPort)
	} else {
		fmt.Fprintf(p.Out, "the segment published no NIC priority matrix and no RDMA devices\n")
	}
	var total uint64
	for _, b := range d.Buffers {
		total += b.Length
	}
	fmt.Fprintf(p.Out, "buffers: %d, %d bytes\n", len(d.Buffers), total)
}

func segmentLine(d *meta.SegmentDesc) string {
	line := fmt.Sprintf("segment %s (%s)", d.Name, d.Protocol)
	if d.Timestamp != "" {
		line += ", published " + d.Timestamp
	}
	return line
}

func printSegmentTopo(p *printer, d *meta.SegmentDesc, m topo.Matrix) {
	nics := m.NICs()
	for _, dev := range d.Devices {
		if !slices.Contains(nics, dev.Name) {
			nics = append(nics, dev.Name)
		}
	}
	header := append([]string{"location"}, nics...)
	var rows [][]string
	for _, loc := range m.Locations() {
		e := m[loc]
		row := []string{loc}
		for _, n := range nics {
			switch {
			case slices.Contains(e.Preferred, n):
				row = append(row, "*")
			case slices.Contains(e.Accessible, n):
				row = append(row, "+")
			default:
				row = append(row, "-")
			}
		}
		rows = append(rows, row)
	}
	fmt.Fprintln(p.Out, segmentLine(d))
	p.Table("priority matrix", header, rows)
	fmt.Fprintln(p.Out, "* preferred, + accessible (used when the preferred NICs fail), - not listed")
	fmt.Fprintln(p.Out)
	rows = rows[:0]
	for _, dev := range d.Devices {
		rows = append(rows, []string{dev.Name, strconv.Itoa(int(dev.LID)), dev.GID})
	}
	p.Table("devices", []string{"device", "lid", "gid"}, rows)
}
