#!/usr/bin/env python3
"""Record Mooncake master RPC traffic as test data.

A TCP proxy between Mooncake clients (or mc) and a mooncake_master: every
coro_rpc request and its response are written as one JSON line, in the
format of pkg/store/mooncake/testdata/captures-*.jsonl:

  {"call": "Ping", "function_id": "0xd6c2dae5", "request_header": "...",
   "request_body": "...", "response_header": "...", "response_body": "..."}

Usage: mooncake-capture.py LISTEN_PORT MASTER_HOST:MASTER_PORT OUT.jsonl
Point the client at 127.0.0.1:LISTEN_PORT; stop with SIGINT/SIGTERM.
Frames: request header 20 bytes (magic 0x15, version, serialize type,
msg type, u32 seq, u32 function id, u32 length, u32 attach length), then
body and attachment; response header 16 bytes (magic, version, err code,
msg type, u32 seq, u32 length, u32 attach length). Little-endian.
"""
import asyncio
import hashlib
import json
import signal
import struct
import sys

# The handlers mooncake_master registers (mooncake-store/src/rpc_service.cpp);
# names only, to label captured calls by their function id.
METHODS = """ExistKey BatchQueryIp BatchReplicaClear GetReplicaListByRegex GetReplicaList
BatchGetReplicaList PutStart PutEnd PutRevoke BatchPutStart BatchPutEnd BatchPutRevoke
UpsertStart UpsertEnd UpsertRevoke BatchUpsertStart BatchUpsertEnd BatchUpsertRevoke
Remove RemoveByRegex RemoveAll BatchRemove MountSegment MountNoFSegment ReMountSegment
ReMountNoFSegment UnmountSegment GracefulUnmountSegment UnmountNoFSegment GetAllNoFSegments
GetNoFSegmentsByName Ping GetFsdir QuerySegmentStatus QuerySegmentStatusById
GetStorageConfig BatchExistKey ServiceReady MountLocalDiskSegment UnmountLocalDiskSegment
OffloadObjectHeartbeat ReportSsdCapacity NotifyOffloadSuccess PromotionObjectHeartbeat
PromotionAllocStart NotifyPromotionSuccess NotifyPromotionFailure CopyStart
DynamicReplicaCopyStart CopyEnd DynamicReplicaCopyEnd CopyRevoke DynamicReplicaCopyRevoke
MoveStart MoveEnd MoveRevoke EvictDiskReplica BatchEvictDiskReplica PollRemoveAll
CreateCopyTask CreateMoveTask QueryTask FetchTasks MarkTaskToComplete CalcCacheStats
CreateDrainJob QueryDrainJob CancelDrainJob""".split()


def fid(name):
    d = hashlib.md5(("mooncake::WrappedMasterService::" + name).encode()).digest()
    return int.from_bytes(d[:4], "big")


NAMES = {fid(m): m for m in METHODS}


async def read_frame(reader, hlen, len_off):
    head = await reader.readexactly(hlen)
    if head[0] != 0x15:
        raise ValueError("not coro_rpc: magic 0x%02x" % head[0])
    length, attach = struct.unpack_from("<II", head, len_off)
    body = await reader.readexactly(length + attach)
    return head, body


async def pipe(creader, cwriter, out):
    mreader, mwriter = await asyncio.open_connection(MASTER_HOST, MASTER_PORT)
    pending = {}

    async def up():
        try:
            while True:
                head, body = await read_frame(creader, 20, 12)
                seq, fn = struct.unpack_from("<II", head, 4)
                pending[seq] = (fn, head, body)
                mwriter.write(head + body)
                await mwriter.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            mwriter.close()

    async def down():
        try:
            while True:
                head, body = await read_frame(mreader, 16, 8)
                (seq,) = struct.unpack_from("<I", head, 4)
                fn, qh, qb = pending.pop(seq, (0, b"", b""))
                out.write(json.dumps({
                    "call": NAMES.get(fn, "0x%08x" % fn), "function_id": "0x%08x" % fn,
                    "request_header": qh.hex(), "request_body": qb.hex(),
                    "response_header": head.hex(), "response_body": body.hex()}) + "\n")
                out.flush()
                cwriter.write(head + body)
                await cwriter.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            cwriter.close()

    await asyncio.gather(up(), down())


async def main():
    out = open(OUT, "a")
    server = await asyncio.start_server(lambda r, w: pipe(r, w, out), "127.0.0.1", LISTEN)
    stop = asyncio.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(s, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    LISTEN = int(sys.argv[1])
    MASTER_HOST, port = sys.argv[2].rsplit(":", 1)
    MASTER_PORT = int(port)
    OUT = sys.argv[3]
    asyncio.run(main())
