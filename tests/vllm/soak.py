"""The serving soak: vLLM engines serving a stream of requests through mcstore for
minutes, with the store full and faults injected, and what must hold while it runs.

    report = Soak(workdir, duration_s=150, faults=DEFAULT_FAULTS).run()

Set-up: deploy/local-cluster.sh starts one mc-master and two mc-clients whose memory is about a
quarter of the KV the prompts produce (the master's watermarks at 0.97/0.99, so memory runs at
>= 95% with eviction working all the time); engine i (soak_engine.py) is served by client i.
The prompts share prefixes of varied depth (a tree of roots and branches), so engines load each
other's blocks and lookups hit at every depth.

Faults (times in seconds from the start; each the documented way, local-cluster.sh restart):
  corrupt         a 512 KiB range in the middle of client2's segment is overwritten (through
                  /proc/PID/mem): the objects there fail their checksum, are dropped, recomputed
  kill_holder     client2 (a holder of engine 1's reads) SIGKILLed and restarted
  restart_own     client1 (engine 1's own daemon) SIGKILLed and restarted
  restart_master  mc-master SIGKILLed and restarted

Samples every 2 s: leases on the master and on each daemon, the daemons' lease-cap refusals, the
master's memory use and eviction counters, and what each process holds that must not grow: its
open fds and threads (/proc), and each daemon's registered buffers, fast-channel connections,
fd sessions and data-plane connections (its gauges). Once the engines are gone every lease,
buffer, fast connection and fd session must come back to zero (`final`). The engines' counters
come from their stats files. At the end a reference engine without the connector generates every
prompt twice (cold, then from vLLM's local prefix cache): every output of the soak must equal one
of the two.
"""

import json
import os
import random
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))

BS = 32
BLOCK_BYTES = 65536 + 128     # the tiny model's KV block (2 layers, 2 KV heads, 64, fp32) + header
DEFAULT_FAULTS = [(35, "corrupt"), (65, "kill_holder"), (95, "restart_own"),
                  (125, "restart_master")]


def make_prompts(seed=7, roots=8, per_root=8):
    """Prompts over a tree: each root is 6 blocks; a prompt takes the first 1..6 of them, then
    1..3 blocks of its own and 1..31 more tokens (never block-aligned)."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(3, 2000) for _ in range(n)]  # noqa: E731
    out = []
    for _ in range(roots):
        root = tok(6 * BS)
        for _ in range(per_root):
            depth = rng.randint(1, 6)
            out.append(root[:depth * BS] + tok(rng.randint(1, 3) * BS + rng.randint(1, 31)))
    return out


def distinct_blocks(prompts):
    seen = set()
    for p in prompts:
        for b in range(len(p) // BS):
            seen.add(tuple(p[:(b + 1) * BS]))
    return len(seen)


def _metrics(http):
    import urllib.request
    with urllib.request.urlopen("http://%s/metrics" % http, timeout=5) as r:
        return r.read().decode()


def metric_sum(text, name, **labels):
    """Sum of the samples of `name` whose labels include `labels` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


class Soak:
    def __init__(self, workdir, duration_s=150, faults=None, engines=2, store_fraction=0.25,
                 log=print):
        self.workdir = workdir
        self.duration_s = duration_s
        self.faults = list(DEFAULT_FAULTS if faults is None else faults)
        self.engines = engines
        self.log = log
        self.run_dir = os.path.join(workdir, "cluster")
        self.build = os.environ.get("MC_BUILD_DIR", os.path.join(ROOT, "build"))
        self.prompts = make_prompts()
        kv_bytes = distinct_blocks(self.prompts) * BLOCK_BYTES
        # Each daemon's segment: a share of the KV the prompts produce (both together hold
        # `store_fraction` of it), rounded to 64 KiB.
        self.segment = max(4 << 20, int(kv_bytes * store_fraction / 2) // 65536 * 65536)
        self.samples = []
        self.fault_log = []
        self.env = dict(os.environ)
        extra = subprocess.run([os.path.join(ROOT, "deploy", "python-venv.sh"), "env"],
                               capture_output=True, text=True, check=True).stdout.strip()
        k, _, v = extra.partition("=")
        if v:
            self.env[k] = v
        self.env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.env["OMP_NUM_THREADS"] = self.env.get("OMP_NUM_THREADS", "1")
        self.env["PYTHONPATH"] = os.path.join(ROOT, "tests")
        self.env["MC_RUN_DIR"] = self.run_dir
        self.env["MC_BUILD_DIR"] = self.build
        self.env["MC_SEGMENT_SIZE"] = str(self.segment)
        self.env["MC_MASTER_ARGS"] = "--high_watermark 0.99 --low_watermark 0.97"

    # -- cluster -----------------------------------------------------------------------------
    def cluster(self, *args):
        return subprocess.run([os.path.join(ROOT, "deploy", "local-cluster.sh")] + list(args),
                              env=self.env, capture_output=True, text=True, timeout=120)

    def ready(self, name):
        with open(os.path.join(self.run_dir, name + ".json")) as f:
            return json.load(f)

    def corrupt_segment(self, name="client2", length=512 << 10):
        """Overwrites `length` bytes in the middle of daemon `name`'s memory segment."""
        with open(os.path.join(self.run_dir, name + ".pid")) as f:
            pid = int(f.read())
        with open("/proc/%d/maps" % pid) as f:
            maps = f.read().splitlines()
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if hi - lo == self.segment:
                with open("/proc/%d/mem" % pid, "r+b") as mem:
                    mem.seek(lo + self.segment // 2)
                    mem.write(os.urandom(length))
                return lo
        raise RuntimeError("no mapping of %d bytes in %s" % (self.segment, name))

    def inject(self, what):
        t = time.monotonic() - self.t0
        if what == "corrupt":
            self.corrupt_segment()
            r = None
        elif what == "kill_holder":
            r = self.cluster("restart", "client2", "--kill")
        elif what == "restart_own":
            r = self.cluster("restart", "client1", "--kill")
        elif what == "restart_master":
            r = self.cluster("restart", "master", "--kill")
        else:
            raise ValueError(what)
        took = time.monotonic() - self.t0 - t
        ok = r is None or r.returncode == 0
        self.fault_log.append({"t": round(t, 1), "fault": what, "took_s": round(took, 1),
                               "ok": ok, "out": "" if r is None else (r.stdout + r.stderr)[-400:]})
        self.log("soak: t=%5.1f s  %s (%.1f s)%s" % (t, what, took, "" if ok else " FAILED"))

    def held(self, name):
        """Open fds and threads of process `name` (its pid file), or {} when it is not up."""
        try:
            with open(os.path.join(self.run_dir, name + ".pid")) as f:
                pid = int(f.read())
            fds = len(os.listdir("/proc/%d/fd" % pid))
            with open("/proc/%d/status" % pid) as f:
                threads = int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))
        except (OSError, ValueError, AttributeError):
            return {}
        return {name + "_fds": fds, name + "_threads": threads}

    def sample(self):
        s = {"t": round(time.monotonic() - getattr(self, "t0", time.monotonic()), 1)}
        s.update(self.held("master"))
        try:
            m = _metrics(self.ready("master")["http"])
            s["master_leases"] = metric_sum(m, "mc_leases_active")
            s["mem_used"] = metric_sum(m, "mc_memory_used_bytes")
            s["mem_capacity"] = metric_sum(m, "mc_memory_capacity_bytes")
            s["evict_attempts"] = metric_sum(m, "mc_eviction_attempts_total")
            s["evict_successes"] = metric_sum(m, "mc_eviction_successes_total")
            s["skipped_leased"] = metric_sum(m, "mc_eviction_skipped_total", reason="leased")
            s["replicas_dropped"] = metric_sum(m, "mc_replicas_dropped_total")
            s["master_epoch"] = metric_sum(m, "mc_master_epoch")
            s["master_lane_connections"] = metric_sum(m, "mc_master_lane_connections")
        except Exception as e:  # a restart in progress: the sample says so
            s["master_error"] = repr(e)[:100]
        for i in range(1, self.engines + 1):
            try:
                m = _metrics(self.ready("client%d" % i)["http"])
                s["client%d_leases" % i] = metric_sum(m, "mc_client_prefix_leases")
                s["client%d_lease_cap_refusals" % i] = metric_sum(
                    m, "mc_store_limit_refusals_total", limit="leases")
                s["client%d_mismatches" % i] = metric_sum(m, "mc_client_checksum_mismatches_total")
                s["client%d_buffers" % i] = metric_sum(m, "mc_client_buffers")
                s["client%d_fast_connections" % i] = metric_sum(m, "mc_store_fast_connections")
                s["client%d_fd_sessions" % i] = metric_sum(m, "mc_store_fd_sessions")
                s["client%d_dataplane_connections" % i] = metric_sum(
                    m, "mc_dataplane_connections")
            except Exception as e:
                s["client%d_error" % i] = repr(e)[:100]
            s.update(self.held("client%d" % i))
        self.samples.append(s)
        return s

    # -- engines -----------------------------------------------------------------------------
    def start_engine(self, i, address, no_connector=False, passes=0):
        tag = "ref" if no_connector else "engine%d" % i
        cmd = [sys.executable, os.path.join(HERE, "soak_engine.py"), "--model", self.model,
               "--address", address, "--prompts", self.prompts_file, "--order-seed", str(i),
               "--stats", os.path.join(self.workdir, tag + ".stats"),
               "--out", os.path.join(self.workdir, tag + ".out"),
               "--stop", os.path.join(self.workdir, "stop")]
        if no_connector:
            cmd += ["--no-connector", "--passes", str(passes), "--num-blocks", "512"]
        log = open(os.path.join(self.workdir, tag + ".log"), "w")
        return subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def run(self):
        os.makedirs(self.workdir, exist_ok=True)
        self.model = os.path.join(self.workdir, "model")
        subprocess.run([sys.executable, os.path.join(HERE, "tiny_model.py"), self.model],
                       env=self.env, check=True, timeout=300, capture_output=True)
        self.prompts_file = os.path.join(self.workdir, "prompts.json")
        with open(self.prompts_file, "w") as f:
            json.dump(self.prompts, f)
        r = self.cluster("start", "2")
        if r.returncode != 0:
            raise RuntimeError("local-cluster start failed:\n" + r.stdout + r.stderr)
        self.log("soak: %d prompts, %d distinct blocks (%.0f MiB of KV), 2 daemons of %.1f MiB"
                 % (len(self.prompts), distinct_blocks(self.prompts),
                    distinct_blocks(self.prompts) * BLOCK_BYTES / 2**20, self.segment / 2**20))
        procs = []
        # What the idle processes hold before any engine connects (fds, threads, gauges).
        self.idle_sample = self.sample()
        self.samples.clear()
        try:
            for i in range(1, self.engines + 1):
                sock = os.path.join(self.run_dir, "client%d.sock" % i)
                procs.append(self.start_engine(i, "unix:" + sock))
            self.wait_engines_up(procs)
            self.t0 = time.monotonic()
            faults = sorted(self.faults)
            next_sample = 0.0
            while True:
                t = time.monotonic() - self.t0
                if t >= self.duration_s:
                    break
                for p in procs:
                    if p.poll() is not None:
                        raise RuntimeError("an engine exited early (%s)" % p.returncode)
                if faults and t >= faults[0][0]:
                    self.inject(faults.pop(0)[1])
                if t >= next_sample:
                    self.sample()
                    next_sample = t + 2.0
                time.sleep(0.1)   # the driver's own pacing (bounded by duration_s)
            open(os.path.join(self.workdir, "stop"), "w").close()
            for p in procs:
                p.wait(timeout=300)
            # The engines are gone: every lease must end (released, not expired), and what the
            # daemons held for them (buffers, fast connections, fd sessions) must be let go.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                s = self.sample()
                if s.get("master_leases", 1) == 0 and all(
                        s.get("client%d_%s" % (i, what), 1) == 0
                        for i in range(1, self.engines + 1)
                        for what in ("leases", "buffers", "fast_connections", "fd_sessions")):
                    break
                time.sleep(0.2)   # polling interval inside the 30 s deadline above
            self.final_sample = self.samples[-1]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            self.cluster("stop")
        os.unlink(os.path.join(self.workdir, "stop"))
        ref = self.start_engine(0, "", no_connector=True, passes=2)
        ref.wait(timeout=900)
        return self.report()

    def wait_engines_up(self, procs, limit_s=900):
        """Until every engine wrote its first stats line (its LLM is built): loading vLLM takes
        from seconds to minutes on a loaded machine, and faults and windows count from here."""
        deadline = time.monotonic() + limit_s
        tags = ["engine%d" % i for i in range(1, self.engines + 1)]
        while True:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError("an engine exited while starting (%s)" % p.returncode)
            up = [t for t in tags if os.path.exists(os.path.join(self.workdir, t + ".stats"))
                  and self._stats(t)]
            if len(up) == len(tags):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("engines not up after %d s: %s" % (limit_s, up))
            time.sleep(0.2)   # polling inside the deadline above

    # -- what the run shows ------------------------------------------------------------------
    def _stats(self, tag):
        """The engine's lines, their "t" on the driver's axis (seconds since self.t0)."""
        with open(os.path.join(self.workdir, tag + ".stats")) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        if getattr(self, "t0", None) is not None:
            for line in lines:
                if "mono" in line:
                    line["t"] = round(line["mono"] - self.t0, 3)
        return lines

    def _outputs(self, tag):
        with open(os.path.join(self.workdir, tag + ".out")) as f:
            return {int(k): v for k, v in json.load(f).items()}

    def report(self):
        ref = self._outputs("ref")
        rep = {"faults": self.fault_log, "samples": self.samples, "engines": {},
               "segment_bytes": self.segment, "final": self.final_sample,
               "idle": self.idle_sample}
        for i in range(1, self.engines + 1):
            tag = "engine%d" % i
            stats = self._stats(tag)
            outs = self._outputs(tag)
            wrong = {k: v for k, v in outs.items() if any(o not in ref.get(k, []) for o in v)}
            rep["engines"][tag] = {"stats": stats, "wrong_outputs": wrong,
                                   "prompts_served": len(outs)}
        return rep


def accumulate(samples, key):
    """A counter's growth over samples taken across daemon restarts (a restart resets it)."""
    total, prev = 0.0, None
    for s in samples:
        v = s.get(key)
        if v is None:
            continue
        total += v - prev if prev is not None and v >= prev else (v if prev is not None else 0)
        prev = v
    return total


def per_minute(rep, every_s=60):
    """Rows per interval: time, requests, hit rate, leases, eviction, failed loads and saves,
    latency of hits vs recomputes (the engines summed)."""
    rows = []
    end = max(s["t"] for s in rep["samples"])
    t = 0.0
    prev = {}
    while t < end:
        row = {"t": "%d-%d s" % (t, t + every_s)}
        req = hits = lookups = failed_loads = save_err = saves = 0
        lat_h, lat_m = [], []
        for name, e in rep["engines"].items():
            inside = [s for s in e["stats"] if t < s["t"] <= t + every_s]
            if not inside:
                continue
            last = inside[-1]
            p = prev.get(name, {"requests": 0, "hits": 0, "worker": {}, "sched": {}})
            req += last["requests"] - p["requests"]
            hits += last["hits"] - p["hits"]
            w, pw = last.get("worker", {}), p.get("worker", {})
            sc, ps = last.get("sched", {}), p.get("sched", {})
            lookups += sc.get("lookups", 0) - ps.get("lookups", 0)
            failed_loads += w.get("load_error_blocks", 0) - pw.get("load_error_blocks", 0)
            save_err += w.get("save_error_blocks", 0) - pw.get("save_error_blocks", 0)
            saves += (w.get("save_blocks", 0) + w.get("save_existing_blocks", 0)
                      + w.get("save_error_blocks", 0)
                      - pw.get("save_blocks", 0) - pw.get("save_existing_blocks", 0)
                      - pw.get("save_error_blocks", 0))
            for s in inside:
                lat_h += s.get("lat_hit", [])
                lat_m += s.get("lat_miss", [])
            prev[name] = last
        samples = [s for s in rep["samples"] if t < s["t"] <= t + every_s]
        leases = max([s.get("master_leases", 0) for s in samples] or [0])
        ev = [s for s in samples if "evict_attempts" in s]
        row.update(requests=req, hit_rate=round(hits / req, 3) if req else 0.0,
                   lookups_per_request=round(lookups / req, 2) if req else 0.0,
                   leases_max=leases, failed_loads=failed_loads,
                   save_fail_ratio=round(save_err / saves, 4) if saves else 0.0,
                   mem_used=round(max([s["mem_used"] / s["mem_capacity"] for s in samples
                                       if s.get("mem_capacity")] or [0]), 3))
        if len(ev) >= 2:
            row["evictions"] = "%d/%d" % (accumulate(ev, "evict_successes"),
                                          accumulate(ev, "evict_attempts"))
        med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
        mh, mm = med(lat_h), med(lat_m)
        row["latency_hit_s"], row["latency_recompute_s"] = mh, mm
        row["latency_ratio"] = round(mh / mm, 3) if mh and mm else None
        rows.append(row)
        t += every_s
    return rows
