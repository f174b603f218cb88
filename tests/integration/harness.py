"""Shared helpers for integration tests that run the real mcstore daemons.

A Daemon starts one binary with its arguments plus `--ready_file <tmp>/<name>.ready.json`, waits
(bounded) for that JSON file to appear, exposes its fields (bound addresses: everything listens on
port 0, so no free-port guessing), and on stop() terminates it (SIGTERM, then SIGKILL after a grace
period) and keeps its stdout/stderr in a log file for post-mortems.

    with harness.Daemon("mc-master", harness.binary("master/mc-master"),
                        ["--listen", "127.0.0.1:0"], tmpdir) as master:
        addr = master.ready["grpc"]

Also: binary() (locates a built binary via $MC_BUILD_DIR), http_get(), wait_until(),
parse_prometheus(). Standard library only.
"""

import atexit
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request


class DaemonError(RuntimeError):
    pass


def build_dir():
    d = os.environ.get("MC_BUILD_DIR")
    if not d:
        raise DaemonError("MC_BUILD_DIR is not set (run through ctest or set it to the build dir)")
    return d


def binary(relative_path):
    """Absolute path of a built binary, e.g. binary("master/mc-master")."""
    path = os.path.join(build_dir(), relative_path)
    if not os.access(path, os.X_OK):
        raise DaemonError("binary not built: %s" % path)
    return path


def wait_until(predicate, timeout_s, interval_s=0.05, what="condition"):
    """Polls predicate() until it returns a truthy value (returned) or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError("timed out after %.1fs waiting for %s" % (timeout_s, what))
        time.sleep(interval_s)  # the poll interval, inside the deadline above


def http_get(address, path, timeout_s=5.0):
    """GET http://address/path; returns (status, body as str). Non-2xx statuses do not raise."""
    url = "http://%s%s" % (address, path)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def parse_prometheus(text):
    """Parses Prometheus text format into {(name, frozenset(labels.items())): float}.

    Also returns, under the plain name, the sum over all label sets of that name, so callers can
    write m["mc_keys"] or m["mc_master_rpc_requests_total"] (summed over rpc labels)."""
    out = {}
    sums = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        if "{" in name_labels:
            name, _, rest = name_labels.partition("{")
            labels = {}
            for part in _split_labels(rest.rstrip("}")):
                k, _, v = part.partition("=")
                labels[k] = v.strip('"')
        else:
            name, labels = name_labels, {}
        v = float(value)
        out[(name, frozenset(labels.items()))] = v
        sums[name] = sums.get(name, 0.0) + v
    out.update(sums)
    return out


def _split_labels(s):
    parts, cur, quoted = [], "", False
    for i, c in enumerate(s):
        if c == '"' and (i == 0 or s[i - 1] != "\\"):
            quoted = not quoted
        if c == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    if cur:
        parts.append(cur)
    return parts


_SECRET_FILE = None
_AUTH_BINARIES = ("mc-master", "mc-client", "mc-client-fakegpu")


def cluster_secret_file():
    """A cluster secret file (mode 0600) shared by every daemon this process starts; created once.

    The daemons refuse to start without one unless --auth=false (docs/security.md), so Daemon
    passes it to mc-master and mc-client unless the caller chose --auth or a secret itself."""
    global _SECRET_FILE
    if _SECRET_FILE is None:
        d = tempfile.mkdtemp(prefix="mc-secret-")
        path = os.path.join(d, "cluster.secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        atexit.register(shutil.rmtree, d, True)
        _SECRET_FILE = path
    return _SECRET_FILE


def auth_args(path, args):
    """The authentication flags Daemon adds for `path` given the caller's `args`."""
    if os.path.basename(path) not in _AUTH_BINARIES:
        return []
    if any(a.startswith(("--auth", "--cluster_secret_file", "--member_credential_file"))
           for a in args):
        return []
    return ["--cluster_secret_file", cluster_secret_file()]


class Daemon:
    """One daemon process started with --ready_file; see the module docstring."""

    def __init__(self, name, path, args, workdir, ready_timeout_s=30.0, env=None,
                 ready_flag="--ready_file"):
        self.name = name
        self.path = path
        self.args = list(args)
        self.workdir = workdir
        self.ready_timeout_s = ready_timeout_s
        self.env = env
        self.ready_flag = ready_flag
        self.ready_path = os.path.join(workdir, "%s.ready.json" % name)
        self.log_path = os.path.join(workdir, "%s.log" % name)
        self.proc = None
        self.ready = None
        self._log = None

    def start(self):
        if os.path.exists(self.ready_path):
            os.unlink(self.ready_path)
        self._log = open(self.log_path, "ab")
        cmd = ([self.path] + self.args + auth_args(self.path, self.args) +
               [self.ready_flag, self.ready_path])
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        try:
            self.ready = wait_until(self._read_ready, self.ready_timeout_s,
                                    what="%s ready file" % self.name)
        except Exception:
            self.stop()
            raise DaemonError("%s did not become ready:\n%s" % (self.name, self.log_tail()))
        return self

    def _read_ready(self):
        if self.proc.poll() is not None:
            raise DaemonError("%s exited with %s before ready:\n%s"
                              % (self.name, self.proc.returncode, self.log_tail()))
        try:
            with open(self.ready_path) as f:
                return json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def pause(self):
        """SIGSTOP: the process stays but stops answering (a hung daemon)."""
        self.signal(signal.SIGSTOP)

    def resume(self):
        self.signal(signal.SIGCONT)

    def stop(self, grace_s=5.0):
        """Terminates (SIGTERM, then SIGKILL after grace_s); returns the exit code. Idempotent."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=grace_s)
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def kill(self):
        """SIGKILL at once (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        return self.stop()

    def log_tail(self, max_bytes=8000):
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
            return data[-max_bytes:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
