"""Damaged SSD tiers through the real daemons: a flipped payload byte, a truncated data file, and
a SIGKILL of the client in the middle of offloading (io_uring and the pread/pwrite fallback).
Whatever happens, a get never answers OK with wrong bytes; damaged records are skipped at
recovery and counted; undamaged ones stay readable."""

import os
import random
import signal
import time
import unittest

from integration import harness
from integration.offload import ssd_cluster as sc

MiB = sc.MiB
N = 16


class CorruptionTest(unittest.TestCase):
    def start(self, ssd_extra=()):
        self.c = sc.SsdCluster(clients=1, segment_size=8 * MiB, pure_clients=1,
                               ssd_extra=ssd_extra)
        self.addCleanup(self.c.stop)
        self.c.start()

    def put_and_persist(self, salt):
        self.keys = [b"cr-%03d" % i for i in range(N)]
        self.values = [sc.value(i, salt=salt) for i in range(N)]
        sc.paced_put(self, self.c, self.c.stub(0), self.keys, self.values)
        self.c.wait_offloaded(0, N)

    def locate(self, i):
        hit = sc.find_in_files(self.c.data_files(0), self.values[i][:256])
        self.assertIsNotNone(hit, "payload of key %d not found in %s" % (i, self.c.data_files(0)))
        return hit

    def check_rest(self, bad):
        """Keys in `bad` answer NOT_FOUND or CHECKSUM_MISMATCH (never OK); the others are exact,
        through the owner and through the pure client."""
        for stub in (self.c.stub(0), self.c.stub(1)):
            results = sc.get_all(stub, self.keys)
            for i, r in enumerate(results):
                if i in bad:
                    self.assertIn(r.code, (sc.NOT_FOUND, sc.CHECKSUM_MISMATCH),
                                  "damaged key %d: %s" % (i, sc.cc.code_name(r.code)))
                else:
                    self.assertEqual(r.code, sc.OK, "key %d: %s %s" % (i, sc.cc.code_name(r.code),
                                                                      r.message))
                    self.assertTrue(r.data == self.values[i], "key %d wrong bytes" % i)

    def test_flipped_payload_byte(self):
        self.start()
        try:
            self.put_and_persist(salt=11)
            self.c.stop_client(0)
            victim = 5
            path, at = self.locate(victim)
            sc.flip_byte(path, at + 100_000)  # inside the payload of key 5
            self.c.start_client(0)
            self.c.wait_reported(0, N - 1)
            self.check_rest({victim})
            skipped = self.c.client_metric(0, "mc_ssd_records_skipped_total")
            mismatches = self.c.client_metric(0, "mc_ssd_checksum_mismatches_total")
            self.assertGreaterEqual(skipped + mismatches, 1)
            self.assertEqual(self.c.ssd_records(0), N - 1)
        except Exception:
            self.c.dump_logs()
            raise

    def test_flipped_header_byte(self):
        self.start()
        try:
            self.put_and_persist(salt=12)
            self.c.stop_client(0)
            victim = 9
            path, at = self.locate(victim)
            # The key lives in the header block just before the payload: find and flip it.
            with open(path, "rb") as f:
                f.seek(at - 4096)
                block = f.read(4096)
            k = block.find(self.keys[victim])
            self.assertGreaterEqual(k, 0)
            sc.flip_byte(path, at - 4096 + k + len(self.keys[victim]) - 1)
            self.c.start_client(0)
            self.c.wait_reported(0, N - 1)
            self.check_rest({victim})
            self.assertGreaterEqual(self.c.client_metric(0, "mc_ssd_records_skipped_total"), 1)
        except Exception:
            self.c.dump_logs()
            raise

    def test_remote_corrupt_record_answers_checksum_mismatch(self):
        """A record damaged while its client runs: a remote reader gets the owner's verdict,
        CHECKSUM_MISMATCH (not TRANSFER_FAILED); the owner drops the record and tells the
        master, so the next get answers NOT_FOUND; the loss is counted."""
        self.start()
        try:
            self.put_and_persist(salt=16)
            victim = 0  # the oldest: on disk only (memory holds the newest)
            served = lambda: self.c.client_metric(0, "mc_client_disk_reads_total", result="ok")
            before = served()
            sc.assert_exact(self, self.c.stub(1), [self.keys[victim]], [self.values[victim]])
            self.assertGreater(served(), before, "key %d must be read from the SSD tier" % victim)
            path, at = self.locate(victim)
            sc.flip_byte(path, at + 200_000)
            r = sc.cc.get_inline(self.c.stub(1), [self.keys[victim]])[0]
            self.assertEqual(r.code, sc.CHECKSUM_MISMATCH, "%s %s" % (sc.cc.code_name(r.code),
                                                                      r.message))
            harness.wait_until(lambda: not sc.cc.exist(self.c.stub(1), [self.keys[victim]])[0],
                               20, what="corrupt record dropped at the master")
            for stub in (self.c.stub(1), self.c.stub(0)):
                r = sc.cc.get_inline(stub, [self.keys[victim]])[0]
                self.assertEqual(r.code, sc.NOT_FOUND, sc.cc.code_name(r.code))
            harness.wait_until(
                lambda: self.c.client_metric(0, "mc_client_disk_corrupt_dropped_total") >= 1, 20,
                what="record deleted by its owner")
            self.assertEqual(sc.cc.metric(self.c.master_http(), "mc_disk_replicas_corrupt_total"),
                             1)
            self.assertEqual(sc.cc.metric(self.c.master_http(), "mc_objects_lost_total",
                                          reason="corrupt"), 1)
            self.check_rest({victim})
        except Exception:
            self.c.dump_logs()
            raise

    def test_truncated_data_file(self):
        self.start()
        try:
            self.put_and_persist(salt=13)
            self.c.stop_client(0)
            victim = 3
            where = {i: self.locate(i) for i in range(N)}
            path, at = where[victim]
            os.truncate(path, at + 300_000)  # cuts key 3's payload, drops what follows it
            # Keys that lived past the cut in that file are gone too.
            bad = {i for i, (p, off) in where.items() if p == path and off >= at}
            self.assertIn(victim, bad)
            self.c.start_client(0)
            self.c.wait_reported(0, N - len(bad))
            self.check_rest(bad)
            self.assertGreaterEqual(self.c.client_metric(0, "mc_ssd_records_skipped_total"), 1)
            self.assertEqual(self.c.ssd_records(0), N - len(bad))
            # The tier still works: new offloads land (possibly in the re-grown file).
            more = [b"cr-new-%d" % i for i in range(6)]
            vals = [sc.value(i, salt=14) for i in range(6)]
            sc.paced_put(self, self.c, self.c.stub(0), more, vals)
            self.c.wait_offloaded(0, 6)
            sc.assert_exact(self, self.c.stub(1), more, vals, what="after truncation")
        except Exception:
            self.c.dump_logs()
            raise

    def sigkill_mid_offload(self, ssd_extra, seed):
        self.start(ssd_extra)
        try:
            rnd = random.Random(seed)
            keys, values = [], []
            for rnd_i in range(3):
                stub = self.c.stub(0)
                base = len(keys)
                # Counted before the puts: 12 MiB into an 8 MiB segment make the puts wait for
                # write-backs, and the last of them may all be done before the puts return.
                before = self.c.offloads(0)
                for i in range(base, base + 12):
                    # Unpaced: offloads run while puts keep coming (memory-only objects may be
                    # evicted before they are persisted; that is a miss, never wrong bytes).
                    k, v = b"mk-%03d" % i, sc.value(i, salt=15)
                    r = sc.cc.put_inline(stub, [(k, v)])[0]
                    self.assertEqual(r.code, sc.OK, r.message)
                    keys.append(k)
                    values.append(v)
                harness.wait_until(lambda: self.c.offloads(0) > before, 30, interval_s=0.002,
                                   what="offloads of this round")
                time.sleep(rnd.uniform(0, 0.03))  # somewhere inside the next record writes
                self.c.stop_client(0, signal.SIGKILL)
                self.c.start_client(0)
                records = self.c.ssd_records(0)
                self.c.wait_reported(0, records)
                for stub in (self.c.stub(0), self.c.stub(1)):
                    # A read whose transfer outlasts its lease (the owner restarting, a busy
                    # machine) is refused as LEASE_EXPIRED: not served, never wrong bytes.
                    ok = sc.assert_never_wrong(self, stub, keys, values,
                                               allowed=(sc.NOT_FOUND, sc.CHECKSUM_MISMATCH,
                                                        sc.LEASE_EXPIRED))
                    self.assertGreater(ok, 0, "some offloaded values survive")
                self.assertGreater(records, 0)
        except Exception:
            self.c.dump_logs()
            raise

    def test_sigkill_mid_offload_io_uring(self):
        self.sigkill_mid_offload((), seed=1)

    def test_sigkill_mid_offload_posix(self):
        self.sigkill_mid_offload(["--offload_force_posix"], seed=2)


if __name__ == "__main__":
    unittest.main()
