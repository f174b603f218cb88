"""Helpers for the SSD-tier integration tests: a loopback cluster (client_cluster.Cluster) whose
memory clients have an SSD tier in <tmp>/ssd-<i>, client restarts (SIGTERM or SIGKILL), paced
puts that let offload keep up, byte-exact read checks, and access to the tier's data files.

Every wait is bounded; Cluster.stop() (registered as a cleanup) kills every daemon and removes the
temp dir, the SSD directories included.
"""

import glob
import os
import re
import signal
import time

from integration import harness
from integration.client import client_cluster as cc
from mcstore.v1 import store_pb2 as spb

MiB = cc.MiB
KiB = cc.KiB
OK = spb.OK
NOT_FOUND = spb.NOT_FOUND
CHECKSUM_MISMATCH = spb.CHECKSUM_MISMATCH
LEASE_EXPIRED = spb.LEASE_EXPIRED


def value(i, size=MiB, salt=0):
    """Distinct, deterministic bytes per index: a repeated random block (searchable on disk)."""
    return cc.payload(size, 1_000_003 * salt + i)


def ssd_args(tmp, i, capacity=256 * MiB, poll_ms=20, extra=()):
    return ["--offload_dir", os.path.join(tmp, "ssd-%d" % i), "--offload_capacity", str(capacity),
            "--offload_poll_ms", str(poll_ms)] + list(extra)


class SsdCluster(cc.Cluster):
    """Cluster whose first `ssd_clients` clients have an SSD tier; the rest keep memory only (or
    are pure clients)."""

    def __init__(self, clients=1, segment_size=8 * MiB, ssd_clients=None, ssd_capacity=256 * MiB,
                 ssd_extra=(), pure_clients=0, master_args=(), client_args=()):
        super().__init__(clients=clients, segment_size=segment_size, master_args=master_args,
                         client_args=client_args, pure_clients=pure_clients)
        n = clients if ssd_clients is None else ssd_clients
        for i in range(n):
            self.per_client_args[i] = ssd_args(self.tmp, i, ssd_capacity, extra=ssd_extra)

    def ssd_dir(self, i):
        return os.path.join(self.tmp, "ssd-%d" % i)

    def data_files(self, i):
        return sorted(glob.glob(os.path.join(self.ssd_dir(i), "*")))

    def stop_client(self, i, sig=signal.SIGTERM):
        d = self.clients[i]
        if sig == signal.SIGKILL:
            d.kill()
        else:
            d.stop(grace_s=10)

    def start_client(self, i):
        """Starts client i again (same id, same SSD dir, new ports) and waits until the master
        counts it alive again."""
        self.clients[i].start()
        harness.wait_until(lambda: cc.metric(self.http(i), "mc_client_registered") == 1, 20,
                           what="client %d registered" % i)
        return self.clients[i]

    def restart_client(self, i, sig=signal.SIGTERM):
        self.stop_client(i, sig)
        return self.start_client(i)

    # -- metrics -----------------------------------------------------------------------------
    def offloads(self, i, result="ok"):
        return cc.metric(self.http(i), "mc_client_offloads_total", result=result)

    def client_metric(self, i, name, **labels):
        return cc.metric(self.http(i), name, **labels)

    def ssd_records(self, i):
        """Records in client i's tier, from its /status line."""
        _, body = harness.http_get(self.http(i), "/status")
        m = re.search(r"SSD Storage: .*?, (\d+) records", body)
        if not m:
            raise AssertionError("no SSD records in client status: %r" % body)
        return int(m.group(1))

    def master_status(self):
        return harness.http_get(self.master_http(), "/status")[1]

    def master_ssd_used(self):
        """(used, capacity) strings of the master's 'SSD Storage: X / Y'."""
        m = re.search(r"SSD Storage: ([^/|]+?) / ([^|\n]+)", self.master_status())
        if not m:
            raise AssertionError("no SSD Storage in master status: %r" % self.master_status())
        return m.group(1).strip(), m.group(2).strip()

    def wait_offloaded(self, i, n, timeout_s=60):
        return harness.wait_until(lambda: self.offloads(i) >= n, timeout_s, interval_s=0.02,
                                  what="%d offloads on client %d" % (n, i))

    def wait_reported(self, i, n, timeout_s=30):
        return harness.wait_until(
            lambda: self.client_metric(i, "mc_client_disk_records_reported_total") >= n,
            timeout_s, interval_s=0.05, what="%d records re-reported by client %d" % (n, i))


def leading_bytes_as_number(text):
    m = re.match(r"([0-9.]+)", text)
    return float(m.group(1)) if m else 0.0


def paced_put(test, cluster, stub, keys, values, owner=0, slack=5, timeout_s=60):
    """Puts keys one by one; before each put, waits until at most `slack` earlier puts are not yet
    offloaded by client `owner` (so memory never has to drop an object that is not on disk).
    `base` offloads already counted are taken into account."""
    base = cluster.offloads(owner)
    for n, (k, v) in enumerate(zip(keys, values)):
        if n >= slack:
            cluster.wait_offloaded(owner, base + n - slack + 1, timeout_s)
        r = cc.put_inline(stub, [(k, v)])[0]
        test.assertEqual(r.code, OK, "put %r: %s %s" % (k, cc.code_name(r.code), r.message))


def get_all(stub, keys, batch=8, lease_id=0):
    out = []
    for b in range(0, len(keys), batch):
        out.extend(cc.get_inline(stub, keys[b:b + batch], lease_id=lease_id))
    return out


def assert_exact(test, stub, keys, values, batch=8, what="", lease_retries=2):
    """Every key reads back OK with exactly its bytes. A key answered LEASE_EXPIRED (its read
    outlived the 5 s read lease: a refusal, never wrong bytes; seen once on an owner just
    restarted, under the sanitizer build and a loaded machine) is read again, at most
    `lease_retries` times, as an application would; any other failure fails at once."""
    results = get_all(stub, keys, batch)
    for _ in range(lease_retries):
        again = [i for i, r in enumerate(results) if r.code == LEASE_EXPIRED]
        if not again:
            break
        print("assert_exact %s: %d key(s) LEASE_EXPIRED, read again" % (what, len(again)))
        for i, r in zip(again, get_all(stub, [keys[i] for i in again], batch)):
            results[i] = r
    for k, v, r in zip(keys, values, results):
        test.assertEqual(r.code, OK, "%s get %r: %s %s" % (what, k, cc.code_name(r.code),
                                                          r.message))
        test.assertTrue(r.data == v, "%s get %r: wrong bytes (%d vs %d)" % (what, k, len(r.data),
                                                                           len(v)))


def assert_never_wrong(test, stub, keys, values, allowed=(NOT_FOUND, CHECKSUM_MISMATCH), batch=8):
    """Every key answers OK with exactly its bytes, or one of `allowed`; returns the OK count."""
    ok = 0
    for k, v, r in zip(keys, values, get_all(stub, keys, batch)):
        if r.code == OK:
            test.assertTrue(r.data == v, "get %r: OK with wrong bytes" % k)
            ok += 1
        else:
            test.assertIn(r.code, allowed, "get %r: %s %s" % (k, cc.code_name(r.code), r.message))
    return ok


def find_in_files(paths, needle):
    """(path, offset) of the first occurrence of `needle` in the files, or None."""
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        at = data.find(needle)
        if at >= 0:
            return p, at
    return None


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


def deadline(seconds):
    end = time.monotonic() + seconds
    return lambda: time.monotonic() > end
