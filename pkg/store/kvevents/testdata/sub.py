# A consumer that is not mc: Debian's python3-zmq (libzmq) and
# python3-msgpack. Prints one JSON line per message with every frame and
# every field of every event, each value with its msgpack type.
import json, struct, sys, zmq, msgpack

endpoint, want = sys.argv[1], int(sys.argv[2])
ctx = zmq.Context()
s = ctx.socket(zmq.SUB)
s.setsockopt(zmq.SUBSCRIBE, b"")
s.setsockopt(zmq.RCVTIMEO, 20000)
s.connect(endpoint)
print(json.dumps({"ready": True}), flush=True)
got = 0
while got < want:
    frames = s.recv_multipart()
    out = {"nframes": len(frames), "topic": frames[0].hex(), "seq_len": len(frames[1]),
           "seq": struct.unpack(">Q", frames[1])[0]}
    ts, events, dp = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    out["ts"], out["dp_rank"] = ts, dp
    out["events"] = [[[k, type(v).__name__, v] for k, v in e.items()] for e in events]
    got += len(events)
    print(json.dumps(out), flush=True)
