// Package topo discovers a host's RDMA NICs, GPUs, NUMA nodes and the PCIe
// tree between them from sysfs, and builds the NIC priority matrix that
// Mooncake's transfer engine consumes (--nic_priority_matrix), explaining
// every choice with a PCIe relation class (PIX, PXB, PHB, NODE, SYS).
//
// Mooncake finds the matrix through verbs and CUDA when its engine starts;
// topo needs neither. Every file is read through an FS rooted at a
// directory ("/" on a host, a fixture tree in tests), and symlinks are
// resolved inside that root. Main types: FS (the reader), Topology (what
// Discover found, with reasons), Matrix and Entry (Mooncake's format, with
// ParseMatrix for files Mooncake or mc wrote).
//
// See shared/spec/topology.md for the algorithm and the classes.
package topo
