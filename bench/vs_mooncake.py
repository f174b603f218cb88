#!/usr/bin/env python3
"""mcstore against Mooncake Store, the same work on the same machine (prints, never asserts).

Run through bench/vs_mooncake.sh, which makes the venv (Mooncake's wheel + this checkout's mcstore
package). Both systems run the way they are meant to be used, on loopback:

- mcstore: deploy/local-cluster.sh (mc-master + two mc-client daemons, --prefault); "node 1" is an
  application process using mcstore.Client on client1's Unix socket, "node 2" one on client2's.
  Their data calls take the daemon's fast channel ("<socket>.fast") when it is there, gRPC with
  --python-grpc (for A/B); the report says which path they took.
- Mooncake: the wheel's mooncake_master; "node 1" and "node 2" are application processes each
  holding a mooncake.store.MooncakeDistributedStore (protocol tcp, metadata P2PHANDSHAKE) that
  mounts a global segment of the same size as an mc-client's.

Per round (default 3; the systems alternate which goes first) and value size: TOTAL bytes of
random values put from node 1 in batches of BATCH (mcstore: Client.put of shm slices; Mooncake:
batch_put_from of a registered buffer, preferred_segment = node 1's own segment, as mcstore puts
into the writer's own daemon first), then got by node 2 (cross: over TCP) and by node 1 (local)
into a registered buffer (Client.get into slices / batch_get_into), every byte compared with
what was put, then removed. GB/s counts the bytes over the time spent inside the batch calls;
CPU s/GB counts the CPU of every process of that side (both application processes by
getrusage, the daemons by /proc/PID/stat) during the phase, less the bench's own filling and
comparing. mc-bench (the C++ client) runs the same sizes on the mcstore cluster when built.

This file starts the systems, drives the rounds and prints the report; each node is this script
run again with --worker, which runs vs_mooncake_node.py's worker_main.
"""

import argparse
import json
import os
import queue
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KiB, MiB = 1 << 10, 1 << 20


def parse_size(text):
    t = text.strip()
    for suffix, mult in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB), ("B", 1)):
        if t.endswith(suffix):
            return int(float(t[:-len(suffix)]) * mult)
    return int(t)


def fmt_size(n):
    for unit, mult in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if n >= mult and n % mult == 0:
            return "%d %s" % (n // mult, unit)
    return "%d B" % n


# ---------------------------------------------------------------------------------------------
# Orchestrator
# ---------------------------------------------------------------------------------------------

class Failure(Exception):
    pass


def log_tail(path, lines=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return "(no log: %s)" % e


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu(pid):
    """utime + stime of a process (all its threads), seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Worker:
    def __init__(self, name, system, node, cfg, logdir, env, timeout):
        self.name, self.timeout = name, timeout
        self.log = os.path.join(logdir, name + ".log")
        self.logf = open(self.log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", system, "--node", str(node),
             "--config", json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.logf, text=True,
            env=env, start_new_session=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.info = self.wait_reply("setup")

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_reply(self, what, timeout=None):
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failure("%s: no answer to %s within %.0f s; its log (%s):\n%s"
                              % (self.name, what, timeout or self.timeout, self.log,
                                 log_tail(self.log)))
            try:
                line = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=10)
                raise Failure("%s exited (status %s) during %s; its log (%s):\n%s"
                              % (self.name, self.proc.returncode, what, self.log,
                                 log_tail(self.log)))
            r = json.loads(line)
            if not r.get("ok"):
                raise Failure("%s: %s; its log (%s):\n%s"
                              % (self.name, r.get("error"), self.log, log_tail(self.log)))
            return r

    def call(self, **cmd):
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # wait_reply reports the exit and the log
        return self.wait_reply(cmd["op"])

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        kill_group(self.proc)
        self.logf.close()


def kill_group(proc, grace=5.0):
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class Side:
    """One system: its daemons (pids for CPU) and its two application processes."""

    def __init__(self, name):
        self.name = name
        self.daemons = {}  # name -> pid
        self.nodes = []

    def cpu(self):
        total = 0.0
        for name, pid in self.daemons.items():
            try:
                total += proc_cpu(pid)
            except OSError:
                raise Failure("%s daemon %s (pid %d) is gone" % (self.name, name, pid))
        for w in self.nodes:
            total += w.call(op="cpu")["cpu"]
        return total


class Bench:
    def __init__(self, args):
        self.args = args
        self.run_dir = os.path.join(HERE, "run", "vs-mooncake-%d" % os.getpid())
        os.makedirs(self.run_dir, exist_ok=True)
        self.mc_run = os.path.join(self.run_dir, "mcstore")
        self.build = os.path.abspath(args.build_dir)
        self.mm_proc = None
        self.mc_started = False
        self.sides = {}
        self.raw = open(os.path.join(self.run_dir, "raw.log"), "w")

    # -- starting ------------------------------------------------------------------------
    def start_mcstore(self, segment):
        # Like Mooncake's master RPC: unauthenticated and plaintext, unless --mc-tls.
        env = dict(os.environ, MC_RUN_DIR=self.mc_run, MC_BUILD_DIR=self.build, MC_AUTH="0",
                   MC_TLS="master" if self.args.mc_tls else "0",
                   MC_SEGMENT_SIZE=str(segment),
                   MC_CLIENT_ARGS=("--prefault " + os.environ.get("MC_CLIENT_ARGS", "")).strip())
        self.mc_started = True
        try:
            r = subprocess.run([os.path.join(ROOT, "deploy", "local-cluster.sh"), "start", "2"],
                               env=env, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise Failure("deploy/local-cluster.sh start did not finish within 120 s; logs in %s"
                          % self.mc_run)
        if r.returncode != 0:
            raise Failure("deploy/local-cluster.sh start failed:\n%s%s" % (r.stdout, r.stderr))
        side = Side("mcstore")
        for name in ("master", "client1", "client2"):
            with open(os.path.join(self.mc_run, name + ".pid")) as f:
                side.daemons[name] = int(f.read())
        return side

    def start_mooncake_master(self):
        exe = shutil.which("mooncake_master", path=os.path.dirname(sys.executable))
        if not exe:
            raise Failure("mooncake_master not found beside %s: run through bench/vs_mooncake.sh"
                          % sys.executable)
        log = os.path.join(self.run_dir, "mooncake_master.log")
        for attempt in range(3):  # a port taken between free_port() and the bind: try again
            rpc, metrics = free_port(), free_port()
            logf = open(log, "a")
            self.mm_proc = subprocess.Popen(
                [exe, "--rpc_address", "127.0.0.1", "--rpc_port", str(rpc),
                 "--metrics_host", "127.0.0.1", "--metrics_port", str(metrics)],
                stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
            logf.close()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.mm_proc.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", rpc), timeout=1):
                        return "127.0.0.1:%d" % rpc, self.mm_proc.pid
                except OSError:
                    time.sleep(0.1)
            if self.mm_proc.poll() is None:
                kill_group(self.mm_proc)
                raise Failure("mooncake_master not listening on %d after 30 s; its log (%s):\n%s"
                              % (rpc, log, log_tail(log)))
            print("mooncake_master exited (status %s), attempt %d; its log:\n%s"
                  % (self.mm_proc.returncode, attempt + 1, log_tail(log, 10)), file=sys.stderr)
        raise Failure("mooncake_master did not start; its log (%s):\n%s" % (log, log_tail(log)))

    def start(self):
        a = self.args
        segment = max(a.total, max(a.sizes) * a.batch) * 5 // 4 + 64 * MiB
        segment = (segment + MiB - 1) // MiB * MiB
        base = {"batch": a.batch, "max_size": max(a.sizes), "seed": 1234}
        mc_base = dict(base, fast_channel=False if a.python_grpc else None,
                       slices=a.python_slices)
        wenv = dict(os.environ)
        mkenv = dict(wenv)
        if a.mooncake_checksum:
            mkenv["MOONCAKE_STORE_CHECKSUM"] = "1"
        for kv in a.mooncake_env:
            k, _, v = kv.partition("=")
            mkenv[k] = v
        if a.mooncake_checksum or a.mooncake_env:
            print("Mooncake nodes' environment: %s"
                  % " ".join(a.mooncake_env + (["MOONCAKE_STORE_CHECKSUM=1"]
                                               if a.mooncake_checksum else [])), flush=True)
        print("starting mcstore (deploy/local-cluster.sh, 2 daemons, segments of %s) and "
              "Mooncake (mooncake_master, 2 stores, segments of %s); logs in %s"
              % (fmt_size(segment), fmt_size(segment), self.run_dir), flush=True)
        mc = self.start_mcstore(segment)
        self.sides["mcstore"] = mc
        for node in (1, 2):
            cfg = dict(mc_base, socket=os.path.join(self.mc_run, "client%d.sock" % node))
            mc.nodes.append(Worker("mcstore-node%d" % node, "mcstore", node, cfg, self.run_dir,
                                   wenv, a.timeout))
        master, pid = self.start_mooncake_master()
        mk = Side("mooncake")
        mk.daemons["mooncake_master"] = pid
        self.sides["mooncake"] = mk
        for node in (1, 2):
            cfg = dict(base, master=master, segment_size=segment, local_buffer_size=64 * MiB)
            mk.nodes.append(Worker("mooncake-node%d" % node, "mooncake", node, cfg, self.run_dir,
                                   mkenv, a.timeout))
        print("Mooncake segments: node 1 %s, node 2 %s"
              % (mk.nodes[0].info.get("segment"), mk.nodes[1].info.get("segment")), flush=True)

    def dead_daemons(self):
        """Which daemons have exited, with their logs' ends (for a failed run's report)."""
        out = []
        if self.mm_proc is not None and self.mm_proc.poll() is not None:
            log = os.path.join(self.run_dir, "mooncake_master.log")
            out.append("mooncake_master exited (status %s); its log (%s):\n%s"
                       % (self.mm_proc.returncode, log, log_tail(log, 15)))
        mc = self.sides.get("mcstore")
        for name, pid in (mc.daemons.items() if mc else ()):
            try:
                with open("/proc/%d/stat" % pid) as f:
                    alive = f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                alive = False
            if not alive:
                log = os.path.join(self.mc_run, name + ".log")
                out.append("mcstore %s exited; its log (%s):\n%s" % (name, log, log_tail(log, 15)))
        return out

    def stop(self):
        for side in self.sides.values():
            for w in side.nodes:
                w.stop()
        if self.mm_proc is not None:
            kill_group(self.mm_proc)
        if self.mc_started:
            env = dict(os.environ, MC_RUN_DIR=self.mc_run, MC_BUILD_DIR=self.build)
            try:
                subprocess.run([os.path.join(ROOT, "deploy", "local-cluster.sh"), "stop"],
                               env=env, capture_output=True, timeout=60)
            except subprocess.TimeoutExpired:
                print("local-cluster.sh stop timed out; daemons may be left in %s" % self.mc_run,
                      file=sys.stderr)
        self.raw.close()

    # -- measuring -----------------------------------------------------------------------
    def phase(self, side, worker, op, size, n, prefix, salt, show_placement=False):
        c0 = side.cpu()
        r = worker.call(op=op, size=size, n=n, batch=self.args.batch, prefix=prefix, salt=salt,
                        show_placement=show_placement)
        c1 = side.cpu()
        r["cpu"] = c1 - c0 - r["excluded_cpu"]
        if "placement" in r:
            # A replica names the transfer engine endpoint (P2P handshake RPC) of the process
            # holding it; node 1's is in its log.
            own = None
            with open(side.nodes[0].log, errors="replace") as f:
                for line in f:
                    if "P2P handshake, listening on" in line:
                        own = line.rsplit(" ", 1)[1].strip()
            print("Mooncake replica of %s, put by node 1 (segment %s, endpoint %s): at %s%s"
                  % (prefix + "-0", side.nodes[0].info.get("segment"), own, r["placement"],
                     "" if own is None else (", node 1's own segment" if own == r["placement"]
                                             else ", NOT node 1's own segment")), flush=True)
        return r

    def round_of(self, system, rnd, size, record):
        a = self.args
        side = self.sides[system]
        n1, n2 = side.nodes
        n = max(1, a.total // size)
        prefix = "vsm-%d-r%d-%d" % (os.getpid(), rnd, size)
        salt = rnd * 1000 + size % 997
        out = {}
        out["put"] = self.phase(side, n1, "put", size, n, prefix, salt,
                                show_placement=(system == "mooncake" and rnd == 0))
        out["get cross"] = self.phase(side, n2, "get", size, n, prefix, salt)
        out["get local"] = self.phase(side, n1, "get", size, n, prefix, salt)
        n1.call(op="remove", size=size, n=n, batch=a.batch, prefix=prefix, salt=salt)
        for op, r in out.items():
            gbs = r["bytes"] / r["call_s"] / 1e9
            line = ("round=%d system=%s size=%d op=%s bytes=%d call_s=%.4f wall_s=%.4f GB/s=%.3f "
                    "cpu_s=%.3f cpu_s_per_GB=%.3f p50_ms=%.3f"
                    % (rnd, system, size, op.replace(" ", "_"), r["bytes"], r["call_s"],
                       r["wall_s"], gbs, r["cpu"], r["cpu"] / (r["bytes"] / 1e9),
                       statistics.median(r["lat"]) * 1e3))
            self.raw.write(line + "\n")
            self.raw.flush()
            if record:
                key = (size, op, system)
                self.results.setdefault(key, []).append(
                    {"gbs": gbs, "cpu": r["cpu"] / (r["bytes"] / 1e9),
                     "p50": statistics.median(r["lat"]) * 1e3})

    def mc_bench(self, rnd, size):
        exe = os.path.join(self.build, "tools", "mc-bench")
        n = max(self.args.batch, self.args.total // size)
        iters = max(1, n // self.args.batch)
        s1 = "unix:" + os.path.join(self.mc_run, "client1.sock")
        s2 = "unix:" + os.path.join(self.mc_run, "client2.sock")
        for op, get_client in (("get cross", s2), ("get local", s1)):
            # --cpu_pids: the master's and both daemons' CPU per GB beside mc-bench's own.
            pids = ",".join(str(p) for p in self.sides["mcstore"].daemons.values())
            cmd = [exe, "--client", get_client, "--put_client", s1, "--value_size", str(size),
                   "--batch", str(self.args.batch), "--keys", str(n), "--iterations", str(iters),
                   "--runs", "1", "--mode", "both", "--dest", "shm", "--cpu_pids", pids]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.timeout)
            except subprocess.TimeoutExpired:
                raise Failure("mc-bench timed out after %d s: %s" % (self.args.timeout,
                                                                     " ".join(cmd)))
            self.raw.write("round=%d mc-bench %s\n%s" % (rnd, op, r.stdout))
            if r.returncode != 0:
                raise Failure("mc-bench failed (%d): %s\n%s%s" % (r.returncode, " ".join(cmd),
                                                                  r.stdout[-2000:],
                                                                  r.stderr[-2000:]))
            for line in r.stdout.splitlines():
                if not line.startswith("mc-bench summary"):
                    continue
                f = dict(kv.split("=", 1) for kv in line.split()[2:] if "=" in kv)
                which = "put" if f.get("op") == "put" else op
                if which == "put" and op != "get cross":
                    continue  # one put figure per round
                own, daemons = (float(f.get(k, "-1")) for k in ("cpu_s/GB", "daemons_cpu_s/GB"))
                self.results.setdefault((size, which, "mc-bench"), []).append(
                    {"gbs": float(f["GB/s"]), "p50": float(f.get("p50_ms", "nan")),
                     "cpu": own + daemons if own >= 0 and daemons >= 0 else None})

    def run(self):
        a = self.args
        self.results = {}
        self.start()
        t0 = time.monotonic()
        print("warm-up (not counted): %s of %s values through each system"
              % (fmt_size(a.total), fmt_size(max(a.sizes))), flush=True)
        for system in ("mcstore", "mooncake"):
            self.round_of(system, 0, max(a.sizes), record=False)
        mcb = os.access(os.path.join(self.build, "tools", "mc-bench"), os.X_OK) and a.mc_bench
        if a.mc_bench and not mcb:
            print("(no %s/tools/mc-bench: build it for the C++ client's column)" % self.build)
        for rnd in range(1, a.rounds + 1):
            order = ("mcstore", "mooncake") if rnd % 2 else ("mooncake", "mcstore")
            r0 = time.monotonic()
            for system in order:
                for size in a.sizes:
                    self.round_of(system, rnd, size, record=True)
            if mcb:
                for size in a.sizes:
                    self.mc_bench(rnd, size)
            print("round %d of %d (%s first): %.1f s" % (rnd, a.rounds, order[0],
                                                        time.monotonic() - r0), flush=True)
        self.report(time.monotonic() - t0)
        for w in self.sides["mcstore"].nodes:
            print("mcstore %s's Python client: %s" % (w.name, w.call(op="transport")["paths"]))
        print("mcstore client1's speculative local copies (its local gets, Python's and "
              "mc-bench's): %s" % self.speculation("client1"))

    def speculation(self, daemon):
        """mc_client_get_speculative_total of one daemon, by outcome, in words."""
        try:
            with open(os.path.join(self.mc_run, daemon + ".json")) as f:
                http = json.load(f)["http"]
            with urllib.request.urlopen("http://%s/metrics" % http, timeout=10) as r:
                text = r.read().decode()
        except (OSError, ValueError, KeyError) as e:
            return "not read (%s)" % e
        got = re.findall(r'^mc_client_get_speculative_total\{outcome="(\w+)"\} (\S+)$', text, re.M)
        return ", ".join("%s %d" % (o, float(v)) for o, v in got) or "none reported"

    def report(self, seconds):
        a = self.args
        med = statistics.median

        def col(size, op, system, field):
            rs = [r[field] for r in self.results.get((size, op, system), [])
                  if r.get(field) is not None]
            return med(rs) if rs else None

        def ratios(size, op):
            mc = self.results.get((size, op, "mcstore"), [])
            mk = self.results.get((size, op, "mooncake"), [])
            return [x["gbs"] / y["gbs"] for x, y in zip(mc, mk) if y["gbs"] > 0]

        def ratio(size, op):
            r = ratios(size, op)
            return med(r) if r else None

        def spread(size, op):
            r = ratios(size, op)
            return "%.2f-%.2f" % (min(r), max(r)) if r else "-"

        def f(v, spec="%.3f"):
            return spec % v if v is not None else "-"

        load = os.getloadavg()
        print()
        print("mcstore vs Mooncake Store %s (non-CUDA wheel, tcp, P2PHANDSHAKE), loopback, "
              "%d rounds, medians; %s per size and phase, batches of %d; load average %.1f; "
              "measured in %.0f s; mcstore's master channel %s"
              % (self.mooncake_version(), a.rounds, fmt_size(a.total), a.batch, load[0], seconds,
                 "over TLS" if a.mc_tls else "plaintext, as Mooncake's"))
        print("GB/s: bytes / time inside the batch calls; ratio: median of the rounds' "
              "mcstore/Mooncake (range: lowest-highest round); CPU: all processes of the side, "
              "s per GB moved (mc-bench's: mc-bench, the master and both daemons)")
        print()
        hdr = ("%-8s %-10s %12s %13s %13s %7s %11s %11s %12s %12s"
               % ("value", "op", "mcstore GB/s", "mc-bench GB/s", "Mooncake GB/s", "ratio",
                  "range", "mc CPU s/GB", "Mk CPU s/GB", "mcb CPU s/GB"))
        print(hdr)
        for size in a.sizes:
            for op in ("put", "get cross", "get local"):
                print("%-8s %-10s %12s %13s %13s %7s %11s %11s %12s %12s"
                      % (fmt_size(size), op, f(col(size, op, "mcstore", "gbs")),
                         f(col(size, op, "mc-bench", "gbs")), f(col(size, op, "mooncake", "gbs")),
                         f(ratio(size, op), "%.2f"), spread(size, op),
                         f(col(size, op, "mcstore", "cpu")), f(col(size, op, "mooncake", "cpu")),
                         f(col(size, op, "mc-bench", "cpu"))))
        small = min(a.sizes)
        print()
        print("p50 per-batch latency, %s local get (%d values per call): mcstore %s ms, "
              "Mooncake %s ms, mc-bench %s ms"
              % (fmt_size(small), a.batch, f(col(small, "get local", "mcstore", "p50")),
                 f(col(small, "get local", "mooncake", "p50")),
                 f(col(small, "get local", "mc-bench", "p50"))))
        print("raw per-round lines: %s" % os.path.join(HERE, "run", "last-vs_mooncake.log"))

    def mooncake_version(self):
        try:
            from importlib.metadata import version
            return version("mooncake-transfer-engine-non-cuda")
        except Exception:
            return "(version unknown)"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", choices=("mcstore", "mooncake"), help=argparse.SUPPRESS)
    p.add_argument("--node", type=int, help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="64KiB,1MiB,4MiB",
                   help="value sizes, comma-separated (default 64KiB,1MiB,4MiB)")
    p.add_argument("--total", default="256MiB",
                   help="bytes put (and got twice) per size and round (default 256MiB)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    p.add_argument("--batch", type=int, default=16, help="values per batch call (default 16)")
    p.add_argument("--no-mc-bench", dest="mc_bench", action="store_false",
                   help="skip the mc-bench (C++ client) column")
    p.add_argument("--mooncake-checksum", action="store_true",
                   help="run Mooncake's stores with MOONCAKE_STORE_CHECKSUM=1 (off by default "
                        "in Mooncake; mcstore always verifies)")
    p.add_argument("--mooncake-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for Mooncake's two store processes (repeatable),"
                        " e.g. MC_TCP_ENABLE_CONNECTION_POOL=1")
    p.add_argument("--python-grpc", action="store_true",
                   help="mcstore's nodes send every call over gRPC (fast_channel=False), not over "
                        "the daemon's fast channel (the default where the daemon serves one)")
    p.add_argument("--python-slices", action="store_true",
                   help="mcstore's nodes name each value as a Slice (built per call) instead of "
                        "a block layout of one run (the default, as the vLLM connector does)")
    p.add_argument("--mc-tls", action="store_true",
                   help="serve mcstore's master gRPC over TLS (deploy/local-cluster.sh's default);"
                        " by default plaintext, as Mooncake's master RPC is")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep bench/run/vs-mooncake-PID/ (daemon and node logs) after a good run")
    p.add_argument("--build-dir", default=os.environ.get("MC_BUILD_DIR",
                                                         os.path.join(ROOT, "build")))
    p.add_argument("--timeout", type=int, default=300,
                   help="seconds any one step may take before the bench gives up (default 300)")
    a = p.parse_args()
    if a.worker:
        from vs_mooncake_node import worker_main  # beside this file (sys.path[0])
        worker_main(a.worker, a.node, json.loads(a.config))
        return 0
    a.sizes = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    a.total = parse_size(a.total)
    for kv in a.mooncake_env:
        if "=" not in kv or not kv.split("=", 1)[0].isidentifier():
            p.error("--mooncake-env wants NAME=VALUE, got %r" % kv)
    if not a.sizes or min(a.sizes) <= 0 or max(a.sizes) > 64 * MiB:
        p.error("--sizes: each between 1 B and 64 MiB")
    if a.batch < 1 or a.batch > 1024 or a.rounds < 1 or a.total < 1:
        p.error("--batch 1-1024, --rounds >= 1, --total > 0")
    for exe in ("master/mc-master", "client/mc-client"):
        if not os.access(os.path.join(a.build_dir, exe), os.X_OK):
            p.error("%s missing: build first (./deploy/build.sh release)"
                    % os.path.join(a.build_dir, exe))
    bench = Bench(a)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    rc = 1  # until the run finishes (an interrupt keeps the logs too)
    try:
        bench.run()
        rc = 0
    except Failure as e:
        print("vs_mooncake: %s" % e, file=sys.stderr)
        for line in bench.dead_daemons():
            print("vs_mooncake: %s" % line, file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut cleanup
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        bench.stop()
        shutil.copy(os.path.join(bench.run_dir, "raw.log"),
                    os.path.join(HERE, "run", "last-vs_mooncake.log"))
        if rc == 0 and not a.keep_logs:
            shutil.rmtree(bench.run_dir, ignore_errors=True)
        else:
            print("vs_mooncake: logs kept in %s" % bench.run_dir, file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
