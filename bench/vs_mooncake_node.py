"""The application processes ("nodes") of bench/vs_mooncake.py: one per system and node, driven
by JSON lines on stdin, answering on stdout (worker_main). McstoreNode uses mcstore.Client on its
daemon's Unix socket, MooncakeNode a mooncake.store.MooncakeDistributedStore; both put from and get
into registered buffers, and every byte got is compared with what was put (Values).

Started by vs_mooncake.py (`vs_mooncake.py --worker SYSTEM --node N --config JSON`), not alone.
"""
import json
import mmap
import resource
import sys
import time

MiB = 1 << 20
POOL = 64 * MiB  # random bytes every value is cut from (same seed in every process)
STRIDE = 4099 * 64  # offset step between consecutive keys' values in the pool


class Values:
    """The expected bytes of key i of a phase: a slice of one random pool, placed by (salt, i)."""

    def __init__(self, seed):
        import numpy as np
        self.np = np
        self.pool = np.frombuffer(np.random.default_rng(seed).bytes(POOL), dtype=np.uint8)

    def offset(self, salt, i, size):
        return ((salt * 7919 + i) * STRIDE) % (POOL - size + 1) // 64 * 64

    def of(self, salt, i, size):
        o = self.offset(salt, i, size)
        return self.pool[o:o + size]


class McstoreNode:
    def __init__(self, cfg):
        from mcstore import Client
        self.client = Client("unix:" + cfg["socket"], timeout_s=120,
                             fast_channel=cfg.get("fast_channel"))
        n = cfg["batch"] * cfg["max_size"]
        self.src = self.client.create_buffer(n)
        self.dst = self.client.create_buffer(n)
        self.src_np = self.src.numpy("uint8", n)
        self.dst_np = self.dst.numpy("uint8", n)
        self.src_np[:] = 0
        self.dst_np[:] = 0
        # Value j of a batch is at j * size in each buffer: a block layout of one run, as the
        # vLLM connector describes its pages (the request carries the run once and one index
        # per key), the counterpart of the pointer lists Mooncake's node passes.
        self.slices = cfg.get("slices", False)
        self.layouts = {}

    def blocks(self, size, n, side):
        """Blocks 0..n-1 of the source (side 0) or destination (side 1) buffer's layout of
        `size`-byte values; only the side the call uses is made (inside the timed call)."""
        if size not in self.layouts:
            self.layouts[size] = tuple(self.client.block_layout([(b.slice(0, size), size)])
                                       for b in (self.src, self.dst))
        return self.layouts[size][side].blocks(range(n))

    def info(self):
        return {}

    def paths(self):
        """Which path the client's data calls took (fast channel or gRPC), in words."""
        s = self.client.transport_stats()
        if s["fast_channel"] is None:
            return "gRPC (fast channel off): %d calls" % s["grpc"]
        not_sent = ", ".join("%s %d" % kv for kv in sorted(s["fast_not_sent"].items()) if kv[1])
        return "fast channel %s: %d calls; gRPC: %d calls%s" % (
            s["fast_channel"], s["fast"], s["grpc"],
            " (not sent fast: %s)" % not_sent if not_sent else "")

    def put(self, keys, size):
        from mcstore import raise_for_results
        if self.slices:
            values = [self.src.slice(j * size, size) for j in range(len(keys))]
        else:
            values = self.blocks(size, len(keys), 0)
        res = self.client.put(keys, values)
        raise_for_results(res)

    def get(self, keys, size):
        from mcstore import raise_for_results
        if self.slices:
            into = [self.dst.slice(j * size, size) for j in range(len(keys))]
        else:
            into = self.blocks(size, len(keys), 1)
        res = self.client.get(keys, into=into)
        raise_for_results(res)
        for r in res:
            if r.size != size:
                raise RuntimeError("mcstore get of %s: size %d, want %d" % (r.key, r.size, size))

    def remove(self, keys):
        from mcstore import Code, raise_for_results
        deadline = time.monotonic() + 60
        while keys:
            res = self.client.remove(keys)
            keys = [r.key for r in res if r.code == Code.HAS_LEASE]
            raise_for_results([r for r in res if r.code not in (Code.HAS_LEASE, Code.NOT_FOUND)])
            if keys:
                if time.monotonic() > deadline:
                    raise RuntimeError("mcstore: %d keys still leased after 60 s" % len(keys))
                time.sleep(0.01)


class MooncakeNode:
    def __init__(self, cfg):
        import numpy as np
        from mooncake.store import MooncakeDistributedStore
        self.store = MooncakeDistributedStore()
        rc = self.store.setup("127.0.0.1", "P2PHANDSHAKE", cfg["segment_size"],
                              cfg["local_buffer_size"], "tcp", "", cfg["master"])
        if rc != 0:
            raise RuntimeError("MooncakeDistributedStore.setup returned %d" % rc)
        n = cfg["batch"] * cfg["max_size"]
        # Page-aligned anonymous mappings, registered once (batch_put_from / batch_get_into
        # want registered memory).
        self.maps = [mmap.mmap(-1, n), mmap.mmap(-1, n)]
        self.src_np, self.dst_np = (np.frombuffer(m, dtype=np.uint8) for m in self.maps)
        self.src_np[:] = 0
        self.dst_np[:] = 0
        self.src_ptr = self.src_np.ctypes.data
        self.dst_ptr = self.dst_np.ctypes.data
        for ptr in (self.src_ptr, self.dst_ptr):
            rc = self.store.register_buffer(ptr, n)
            if rc != 0:
                raise RuntimeError("register_buffer returned %d" % rc)
        self.segment = self.store.get_hostname()
        self.preferred = None

    def info(self):
        return {"segment": self.segment}

    def put(self, keys, size):
        from mooncake.store import ReplicateConfig
        if self.preferred is None:
            self.preferred = ReplicateConfig()
            self.preferred.preferred_segment = self.segment
        rcs = self.store.batch_put_from(keys, [self.src_ptr + j * size for j in range(len(keys))],
                                        [size] * len(keys), self.preferred)
        bad = [(k, rc) for k, rc in zip(keys, rcs) if rc != 0]
        if bad:
            raise RuntimeError("Mooncake batch_put_from: %d of %d failed, first %s"
                               % (len(bad), len(keys), bad[0]))

    def get(self, keys, size):
        rcs = self.store.batch_get_into(keys, [self.dst_ptr + j * size for j in range(len(keys))],
                                        [size] * len(keys))
        bad = [(k, rc) for k, rc in zip(keys, rcs) if rc != size]
        if bad:
            raise RuntimeError("Mooncake batch_get_into: %d of %d failed, first %s (want %d bytes)"
                               % (len(bad), len(keys), bad[0], size))

    def replicas(self, key):
        try:
            desc = self.store.batch_get_replica_desc([key])
            return ", ".join(r.get_memory_descriptor().buffer_descriptor.transport_endpoint
                             if r.is_memory_replica() else "disk" for r in desc.get(key, []))
        except Exception as e:  # diagnostics only
            return "unavailable: %r" % e

    def remove(self, keys):
        # force: skip Mooncake's 10 s read lease (every get of these keys has returned).
        rcs = self.store.batch_remove(keys, True)
        bad = [(k, rc) for k, rc in zip(keys, rcs) if rc != 0]
        if bad:
            raise RuntimeError("Mooncake batch_remove: %d failed, first %s" % (len(bad), bad[0]))


def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker_main(system, node, cfg):
    out = sys.stdout
    sys.stdout = sys.stderr  # libraries' prints go to the log, the protocol stays clean

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        values = Values(cfg["seed"])
        impl = McstoreNode(cfg) if system == "mcstore" else MooncakeNode(cfg)
        reply({"ok": True, **impl.info()})
    except Exception as e:
        reply({"ok": False, "error": "%s node %d setup: %r" % (system, node, e)})
        raise
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "quit":
                reply({"ok": True})
                return
            if op == "cpu":
                reply({"ok": True, "cpu": cpu_self()})
                continue
            if op == "transport":
                reply({"ok": True, "paths": impl.paths() if system == "mcstore" else ""})
                continue
            size, n, batch, salt = cmd["size"], cmd["n"], cmd["batch"], cmd["salt"]
            keys = ["%s-%d" % (cmd["prefix"], i) for i in range(n)]
            if op == "remove":
                for i in range(0, n, 256):
                    impl.remove(keys[i:i + 256])
                reply({"ok": True})
                continue
            excluded = 0.0  # CPU of this thread spent filling and comparing (not the store's)
            call_s, lat = 0.0, []
            w0 = time.perf_counter()
            for i in range(0, n, batch):
                part = keys[i:i + batch]
                if op == "put":
                    c0 = time.thread_time()
                    for j in range(len(part)):
                        impl.src_np[j * size:(j + 1) * size] = values.of(salt, i + j, size)
                    excluded += time.thread_time() - c0
                    t0 = time.perf_counter()
                    impl.put(part, size)
                    d = time.perf_counter() - t0
                else:
                    t0 = time.perf_counter()
                    impl.get(part, size)
                    d = time.perf_counter() - t0
                    c0 = time.thread_time()
                    for j in range(len(part)):
                        got = impl.dst_np[j * size:(j + 1) * size]
                        if not values.np.array_equal(got, values.of(salt, i + j, size)):
                            bad = int(values.np.argmax(got != values.of(salt, i + j, size)))
                            raise RuntimeError("%s node %d: %s differs from what was put "
                                               "(first at byte %d)" % (system, node, part[j], bad))
                    excluded += time.thread_time() - c0
                call_s += d
                lat.append(d)
            wall = time.perf_counter() - w0
            extra = {}
            if op == "put" and system == "mooncake" and cmd.get("show_placement"):
                extra["placement"] = impl.replicas(keys[0])
            reply({"ok": True, "bytes": n * size, "call_s": call_s, "wall_s": wall,
                   "excluded_cpu": excluded, "lat": lat, **extra})
        except Exception as e:
            reply({"ok": False, "error": "%s node %d %s: %r" % (system, node, op, e)})
