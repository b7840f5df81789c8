// Package diag diagnoses queue-pair leaks in an RDMA transfer engine
// (Mooncake's or mc's) by correlating what the kernel says (`rdma resource
// show`, per device or per QP, text or JSON) with what the engine logged
// (glog lines: evictions, QP creation failures, connection and slice
// failures, retired endpoints).
//
// ReadSnapshot parses one rdma output; LogScanner streams logs of any size
// (plain or gzip) with a prefilter so that most lines cost a few byte
// comparisons; Analyze turns both into a Report: per-NIC QP counts against
// the ceiling live endpoints can explain, findings with stable codes, and
// a verdict (healthy, suspect, leak). Sample runs `rdma -j resource show`
// on the live host; Watch samples it repeatedly while following the logs,
// so that a leak shows as growth.
//
// The package stands alone: it imports no other mc package except
// pkg/diag/glog, whose line format it reads.
package diag
