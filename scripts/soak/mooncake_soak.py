"""The soak's client through Mooncake's own Python client.

scripts/store-soak.sh --mooncake-clients N runs this beside mc's clients
(scripts/soak/main.go): one MooncakeDistributedStore, no segment of its
own, putting, upserting, getting and removing values whose bytes name
their key and version (one call in five is one of Mooncake's batch calls,
get_batch, upsert_batch and batch_remove of 2-8 keys), through the
master's Mooncake wire and the nodes' tcp transport, as vLLM's or
SGLang's workers do. Mooncake's client keeps
no checksum: wrong bytes it is handed go to its caller, so this is where
a fence that holds only for mc's clients would show.

Journal and judgement are main.go's (same line format, same states);
keys are soak/m<id>/k<n>. Mooncake's put answers success for a key
that already exists, so a put it acknowledges is journaled "maybe" (its
version may be read, an older one too); its upsert is an
acknowledgement. Mooncake's get returns empty bytes for a miss
and for an error alike, so both are journaled "absent". A call has no
deadline here (Mooncake's client takes none); the soak counts a client
still running 30 s after the end as hung.

    python3 scripts/soak/mooncake_soak.py MASTER ID JOURNAL SECONDS
"""

import datetime
import hashlib
import os
import sys
import time
import random

from store import MooncakeDistributedStore

OBJECT_NOT_FOUND, OBJECT_ALREADY_EXISTS = -704, -705
SIZES = (4096, 65536, 262144, 1048576)
NKEYS = 96


def value(key, ver, size):
    hdr = ("%s v=%d " % (key, ver)).encode()
    return hdr + hashlib.shake_128(hdr).digest(size - len(hdr))


def decode(b):
    parts = b[:4200].split(b" ", 2)
    if len(parts) < 3 or not parts[1].startswith(b"v="):
        return None, 0, False
    try:
        key, ver = parts[0].decode(), int(parts[1][2:])
    except (UnicodeDecodeError, ValueError):
        return None, 0, False
    return key, ver, value(key, ver, len(b)) == b


class Key:
    __slots__ = ("attempted", "floor", "latest", "removed_at")

    def __init__(self):
        self.attempted = self.floor = self.latest = self.removed_at = 0


def replay(path, prefix, states):
    """An earlier incarnation's journal: a B with no E counts as attempted."""
    try:
        f = open(path)
    except FileNotFoundError:
        return
    with f:
        for line in f:
            fs = line.split()[1:]
            if len(fs) < 4 or not fs[2].startswith(prefix):
                continue
            try:
                n, v = int(fs[2][len(prefix):]), int(fs[3])
            except ValueError:
                continue
            if not 0 <= n < len(states):
                continue
            st = states[n]
            if fs[0] == "B" and fs[1] in ("put", "upsert"):
                st.attempted = max(st.attempted, v)
            elif fs[0] == "E" and fs[1] in ("put", "upsert") and len(fs) > 4 and fs[4] == "ok":
                st.floor = st.latest = v
            elif fs[0] == "E" and fs[1] == "rm" and len(fs) > 4 and fs[4] == "ok":
                st.floor, st.latest, st.removed_at = v + 1, 0, v


def main():
    master, cid, path, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    prefix = "soak/m%d/k" % cid
    states = [Key() for _ in range(NKEYS)]
    replay(path, prefix, states)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(text):
        # One unbuffered write per line: a SIGKILL loses nothing written.
        now = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]  # main.go's 15:04:05.000
        os.write(fd, ("%s %s\n" % (now, text)).encode())

    end = time.time() + seconds
    s = MooncakeDistributedStore()
    while True:
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master)
        if rc == 0:
            break
        line('N connect 0 error "setup: %d"' % rc)
        if time.time() > end:
            return
        time.sleep(0.5)
        s = MooncakeDistributedStore()

    def judge(key, st, snap, b, ms):
        floor, attempted, latest = snap
        if not b:
            line('E get %s 0 absent %d "empty"' % (key, ms))
            return
        k, v, ok = decode(b)
        if k != key:
            line('E get %s %d WRONG %d "bytes of key %r (%d bytes)"' % (key, v, ms, k, len(b)))
        elif not ok:
            line('E get %s %d WRONG %d "corrupt value claiming version %d (%d bytes)"' % (key, v, ms, v, len(b)))
        elif v > attempted:
            line('E get %s %d WRONG %d "version %d was never put (highest %d)"' % (key, v, ms, v, attempted))
        elif v < floor:
            line('E get %s %d WRONG %d "stale: version %d superseded (floor %d, latest ack %d, removed at %d)"'
                 % (key, v, ms, v, floor, latest, st.removed_at))
        elif v == latest:
            line("E get %s %d latest %d" % (key, v, ms))
        else:
            line("E get %s %d uncertain %d" % (key, v, ms))

    def removed(key, st, rc, ms):
        if rc == 0:
            st.floor, st.latest, st.removed_at = st.attempted + 1, 0, st.attempted
            line("E rm %s %d ok %d" % (key, st.attempted, ms))
        elif rc == OBJECT_NOT_FOUND:
            line("E rm %s %d nf %d" % (key, st.attempted, ms))
        else:
            line('E rm %s %d error %d "code %d"' % (key, st.attempted, ms, rc))

    rng = random.Random()
    while time.time() < end:
        # One key, or a batch of 2-8 distinct keys one time in five
        # (get_batch, upsert_batch, batch_remove: Mooncake's batch calls,
        # as LMCache and vLLM's connector make them).
        ns = rng.sample(range(NKEYS), rng.randint(2, 8)) if rng.randrange(5) == 0 else [rng.randrange(NKEYS)]
        keys = [prefix + str(n) for n in ns]
        sts = [states[n] for n in ns]
        r = rng.randrange(100)
        t = time.monotonic()
        ms = lambda: int((time.monotonic() - t) * 1000)
        if r < 45:
            snaps = [(st.floor, st.attempted, st.latest) for st in sts]
            if len(keys) == 1:
                got = [s.get(keys[0])]
            else:
                got = s.get_batch(keys)
            el = ms()
            for key, st, snap, b in zip(keys, sts, snaps, got):
                judge(key, st, snap, b, el)
        elif r < 75 or (r < 85 and len(keys) > 1):
            vs = []
            for key, st in zip(keys, sts):
                st.attempted += 1
                vs.append(st.attempted)
                line("B upsert %s %d" % (key, st.attempted))
            data = [value(key, v, rng.choice(SIZES)) for key, v in zip(keys, vs)]
            rc = s.upsert(keys[0], data[0]) if len(keys) == 1 else s.upsert_batch(keys, data)
            el = ms()
            for key, st, v in zip(keys, sts, vs):
                if rc == 0:
                    st.floor = st.latest = v
                    line("E upsert %s %d ok %d" % (key, v, el))
                else:
                    # A batch's code is its first failed key's: the others
                    # may or may not have been stored.
                    line('E upsert %s %d error %d "code %d"' % (key, v, el, rc))
        elif r < 85:
            key, st = keys[0], sts[0]
            st.attempted += 1
            v = st.attempted
            line("B put %s %d" % (key, v))
            rc = s.put(key, value(key, v, rng.choice(SIZES)))
            if rc == 0:
                # Mooncake's put answers 0 for a key that exists too
                # (client_service.cpp: OBJECT_ALREADY_EXISTS is success):
                # v may or may not be what the key holds now.
                line("E put %s %d maybe %d" % (key, v, ms()))
            elif rc == OBJECT_ALREADY_EXISTS:
                line("E put %s %d exists %d" % (key, v, ms()))
            else:
                line('E put %s %d error %d "code %d"' % (key, v, ms(), rc))
        else:
            for key, st in zip(keys, sts):
                line("B rm %s %d" % (key, st.attempted))
            rcs = [s.remove(keys[0])] if len(keys) == 1 else s.batch_remove(keys)
            el = ms()
            for key, st, rc in zip(keys, sts, rcs):
                removed(key, st, rc, el)
    s.close()


if __name__ == "__main__":
    main()
