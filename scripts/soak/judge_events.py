"""Judges a soak's KV events (scripts/store-soak.sh --kv-events).

usage: judge_events.py DIR TENANTS(0|1)

Reads DIR/chaos.log, DIR/journals/c*.journal (mc's clients) and
DIR/logs/events*.log (mc store events -o json, with its notices), and
checks that every acknowledged put or upsert has a stored event of its
tenant and key, and every acknowledged removal a removed event, between
the call's start and 2 s after its answer, each event matched to one
call; that no subscriber saw a sequence gap. Calls answered within 1 s
before a master was killed or stopped, or within 3 s after one started,
are left out (the judge says how many). Prints a report; exit 1 on a
missing event or a gap.
"""
import datetime, glob, json, os, re, sys
from collections import defaultdict

d, tenants = sys.argv[1], sys.argv[2] == "1"

def tod(s):  # "HH:MM:SS.mmm" -> seconds after midnight
    h, m, x = s.split(":")
    return int(h) * 3600 + int(m) * 60 + float(x)

try:
    chaos = [l.split(None, 1) for l in open(os.path.join(d, "chaos.log")) if l.strip()]
except OSError as e:
    sys.exit("judge_events: %s (want a soak's directory: chaos.log, journals/, logs/)" % e)
t0 = tod(chaos[0][0]) if chaos else 0.0

def rel(t):  # time of day -> seconds after the first chaos line (a run crossing midnight wraps)
    r = t - t0
    return r + 86400 if r < -3600 else r

# Midnight before the first chaos line, as an epoch, to turn the events'
# epoch milliseconds into the journals' seconds: the log was last written
# at its mtime, which is (mtime's time of day - t0) mod 1 day after t0.
end = os.path.getmtime(os.path.join(d, "chaos.log"))
lt = datetime.datetime.fromtimestamp(end)
end_tod = lt.hour * 3600 + lt.minute * 60 + lt.second + lt.microsecond / 1e6
midnight = end - (end_tod - t0) % 86400 - t0

# Disturbed windows: [t-1, t+stop+3] for a master killed or stopped;
# [t, t+3] after a master starts.
bad = []
for t, what in chaos:
    t = rel(tod(t))
    if re.search(r"\bstart master\d", what):
        bad.append((t, t + 3))
    elif "master" in what and ("SIGKILL" in what or "SIGSTOP" in what or "exited by itself" in what):
        m = re.search(r"for (\d+)s", what) if "SIGSTOP master" in what else None
        bad.append((t - 1, t + (int(m.group(1)) if m else 0) + 3))

def disturbed(t):
    return any(a <= t <= b for a, b in bad)

events = defaultdict(list)  # (type, tenant, key) -> [seconds]
gaps, nevents = [], 0
for f in sorted(glob.glob(os.path.join(d, "logs", "events*.log"))):
    for line in open(f, errors="replace"):
        if line.startswith("{"):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            nevents += 1
            t = e["timestamp_ms"] / 1000 - midnight - t0  # seconds after the first chaos line
            events[(e["type"], e["tenant_id"], e["key"])].append(t)
        elif line.startswith("lost "):
            gaps.append(os.path.basename(f) + ": " + line.strip())
for v in events.values():
    v.sort()

calls = defaultdict(list)  # (type, tenant, key) -> [(start, end)]
left_out = judged = 0
for f in sorted(glob.glob(os.path.join(d, "journals", "c*.journal"))):
    i = int(re.search(r"c(\d+)\.journal$", f).group(1))
    tenant = "t%d" % (i % 2) if tenants else "default"
    for line in open(f, errors="replace"):
        p = line.split()
        if len(p) < 7 or p[1] != "E" or p[5] != "ok" or p[2] not in ("put", "upsert", "rm"):
            continue
        end = rel(tod(p[0]))
        start = end - int(p[6]) / 1000.0
        if disturbed(end) or disturbed(start):
            left_out += 1
            continue
        judged += 1
        calls[("removed" if p[2] == "rm" else "stored", tenant, p[3])].append((start, end))

missing = []
for k, cs in calls.items():
    evs, used = events.get(k, []), set()
    for start, end in sorted(cs, key=lambda c: c[1]):
        hit = next((j for j, t in enumerate(evs) if j not in used and start - 0.05 <= t <= end + 2.0), None)
        if hit is None:
            missing.append((k, start, end))
        else:
            used.add(hit)

print("kv events: %d received by the subscribers; %d acknowledged puts/upserts/removals of mc's clients judged, %d left out "
      "(near a master's kill, stop or start); %d without their event; %d sequence gaps"
      % (nevents, judged, left_out, len(missing), len(gaps)))
for (typ, tenant, key), start, end in missing[:10]:
    print("  no %s event for %s/%s (call %.3f-%.3f s after the first chaos line)" % (typ, tenant, key, start, end))
for g in gaps[:10]:
    print("  " + g)
sys.exit(1 if missing or gaps or (judged > 0 and nevents == 0) else 0)
