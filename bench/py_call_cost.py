#!/usr/bin/env python3
"""The Python client's own cost per fast-channel call, without the daemon's (prints, never
asserts).

Registers buffers with a running mc-client (its Unix socket), opens one fast connection, then
replaces that connection's socket with a stand-in that answers every request at once with the
daemon's all-OK answer: what is left of a call is the client's Python work (request writing,
the channel's pool and header checks, reading the answer into results). Per case, the thread
CPU of a call of 16 items: "hot" = the minimum per call over 30 x 200 back-to-back calls;
"cold" = the median of 2,000 calls each after a numpy compare of 2 x 2 MiB (as a loader that
checks or touches what it got between calls, e.g. bench/vs_mooncake_node.py, leaves the caches).
Keys of one length, as vLLM's and mc-bench's.

    MC_RUN_DIR=/tmp/lc MC_AUTH=0 ./deploy/local-cluster.sh start 1
    PYTHONPATH=python $(./deploy/python-venv.sh path)/bin/python bench/py_call_cost.py \
        --address unix:/tmp/lc/client1.sock

The mcstore package is the first on the path (PYTHONPATH: another checkout's python/ to
compare); its gRPC stubs are generated from this checkout's proto/ when it has none.
"""

import argparse
import os
import statistics
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

B = 16
SIZE = 64 << 10
_HEADER = struct.Struct("<4sIQ")  # the request header (mcstore._fastchannel._REQUEST)
_REPLY = struct.Struct("<4sIQI")


class InstantSocket:
    """Answers each request datagram with `reply` (an OK status, the request's call id)."""

    def __init__(self, real):
        self.real = real
        self.reply = b""
        self.call_id = 0

    def sendmsg(self, parts):
        self.call_id = _HEADER.unpack_from(parts[0])[2]
        return sum(len(p) for p in parts)

    def recv_into(self, buf, nbytes=0, flags=0):
        out = _REPLY.pack(b"MCR1", 0, self.call_id, 0) + self.reply
        buf[:len(out)] = out
        return len(out)

    def close(self):
        self.real.close()


def ensure_stubs():
    """Generates the package's gRPC stubs from proto/ when it has none (a source checkout)."""
    import mcstore
    try:
        import mcstore.v1.store_pb2  # noqa: F401
        return
    except ImportError:
        pass
    import tempfile
    from mcstore import _protogen
    out = tempfile.mkdtemp(prefix="mcstore-bench-gen-")
    _protogen.generate(os.path.join(ROOT, "proto"), out)
    sys.path.insert(0, out)
    mcstore.__path__.insert(1, os.path.join(out, "mcstore"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--address", required=True, help="unix:/path of a running mc-client")
    a = p.parse_args()
    ensure_stubs()
    import numpy as np
    from mcstore import Client, _answers
    c = Client(a.address, timeout_s=30)
    src = c.create_buffer(B * SIZE)
    dst = c.create_buffer(B * SIZE)
    src_layout = c.block_layout([(src.slice(0, SIZE), SIZE)])
    dst_layout = c.block_layout([(dst.slice(0, SIZE), SIZE)])
    src_slices = [src.slice(j * SIZE, SIZE) for j in range(B)]
    dst_slices = [dst.slice(j * SIZE, SIZE) for j in range(B)]
    c.exist(["py-call-cost"])  # opens the fast connection
    if c.transport_stats()["fast"] != 1:
        sys.exit("no fast channel at %s" % a.address)
    conn = c._fast._idle[0]
    fake = InstantSocket(conn.sock)
    conn.sock = fake
    keys = [["pcc-%04d-%02d" % (i, j) for j in range(B)] for i in range(2000)]
    noise = np.random.default_rng(1).integers(0, 255, 8 << 20, dtype=np.uint8)
    same = noise.copy()
    blocks = range(B)
    get_ok = _answers.ok_get_answer([SIZE] * B)
    put_ok = _answers.ok_results_answer("BatchPut", B)
    cases = [
        ("get 16 x layout block", lambda k: c.get(k, into=dst_layout.blocks(blocks)), get_ok),
        ("get 16 x Slice", lambda k: c.get(k, into=dst_slices), get_ok),
        ("put 16 x layout block", lambda k: c.put(k, src_layout.blocks(blocks)), put_ok),
        ("put 16 x Slice", lambda k: c.put(k, src_slices), put_ok),
    ]
    print("client CPU per call (us), socket answered at once: hot (min) / cold (median)")
    try:
        for name, call, reply in cases:
            fake.reply = reply
            hot = 1e9
            for _ in range(30):
                t0 = time.thread_time_ns()
                for i in range(200):
                    call(keys[i & 63])
                hot = min(hot, (time.thread_time_ns() - t0) / 200 / 1e3)
            cold = []
            for i, k in enumerate(keys):
                o = (i * 4099 * 64) % (6 << 20)
                np.array_equal(noise[o:o + (2 << 20)], same[o:o + (2 << 20)])
                t0 = time.thread_time_ns()
                call(k)
                cold.append((time.thread_time_ns() - t0) / 1e3)
            print("  %-22s %6.1f / %6.1f" % (name, hot, statistics.median(cold)))
    finally:
        conn.sock = fake.real
    print("load average: %.1f %.1f %.1f" % os.getloadavg())
    c.close()


if __name__ == "__main__":
    main()
