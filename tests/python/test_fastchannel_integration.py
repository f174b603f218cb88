"""The Python client's fast channel against real daemons (one mc-master, two mc-clients): puts
from and gets into registered shared memory, every byte checked, over the fast channel and with
fast_channel=False over gRPC; that the fast path was really taken (the client's counters and
the daemon's mc_store_fast_calls_total); inline gets staying on gRPC; a lost session."""

import os

import numpy as np
import pytest

from mcstore import Client, Code, Slice, StoreError, raise_for_results
from integration import harness
from integration.client.client_cluster import metrics
from test_client_integration import remove_eventually, uniq

KiB = 1 << 10
MiB = 1 << 20


def fast_calls(cluster, i):
    """The daemon's mc_store_fast_calls_total, summed over its labels."""
    total = 0.0
    for key, value in metrics(cluster.http(i)).items():
        name = key[0] if isinstance(key, tuple) else key
        if name == "mc_store_fast_calls_total":
            total += value
    return total


def view(buf):
    return buf.numpy(np.uint8, buf.size)


def unix(cluster, i):
    return cluster.clients[i].ready["unix_socket"]


@pytest.fixture(scope="module")
def fast_socket(cluster):
    path = unix(cluster, 0) + ".fast"
    if not os.path.exists(path):
        pytest.fail("mc-client made no fast socket at %s" % path)
    return path


def round_trip(c, n, size, seed):
    """put n objects of `size` from one registered buffer, get them into another (reversed),
    and check every byte; returns the keys."""
    src = c.create_buffer(n * size)
    dst = c.create_buffer(n * size)
    data = np.random.default_rng(seed).integers(0, 256, n * size, dtype=np.uint8)
    view(src)[:] = data
    keys = [uniq("fast") for _ in range(n)]
    raise_for_results(c.put(keys, [src.slice(i * size, size) for i in range(n)]))
    got = c.get(keys, into=[dst.slice((n - 1 - i) * size, size) for i in range(n)])
    raise_for_results(got)
    assert all(r.bytes_written == size for r in got)
    out = view(dst)
    for i in range(n):
        j = n - 1 - i
        assert np.array_equal(out[j * size:(j + 1) * size], data[i * size:(i + 1) * size]), i
    del out
    assert c.exist(keys) == [True] * n
    src.close()
    dst.close()
    return keys


@pytest.mark.parametrize("n,size", [(16, 64 * KiB), (16, 1 * MiB)])
def test_shm_round_trip_over_the_fast_channel(cluster, fast_socket, n, size):
    before = fast_calls(cluster, 0)
    with Client("unix:" + unix(cluster, 0), timeout_s=30) as c:
        keys = round_trip(c, n, size, seed=n + size)
        assert [r.code for r in remove_eventually(c, keys)] == [Code.OK] * n
        stats = c.transport_stats()
    assert stats["fast_channel"] == fast_socket
    assert stats["fast"] >= 4 and stats["grpc"] == 0, stats
    assert stats["fast_limit"] >= 4096
    assert fast_calls(cluster, 0) - before >= 4


@pytest.mark.parametrize("n,size", [(16, 64 * KiB), (16, 1 * MiB)])
def test_shm_round_trip_over_grpc(cluster, fast_socket, n, size):
    before = fast_calls(cluster, 0)
    with Client("unix:" + unix(cluster, 0), timeout_s=30, fast_channel=False) as c:
        keys = round_trip(c, n, size, seed=7 * n + size)
        assert [r.code for r in remove_eventually(c, keys)] == [Code.OK] * n
        stats = c.transport_stats()
    assert stats["fast_channel"] is None and stats["fast"] == 0 and stats["grpc"] >= 4
    assert fast_calls(cluster, 0) == before


def test_fast_and_grpc_clients_read_each_others_objects(cluster, fast_socket):
    with Client("unix:" + unix(cluster, 0), timeout_s=30) as fast, \
            Client("unix:" + unix(cluster, 1), timeout_s=30, fast_channel=False) as slow:
        n, size = 8, 32 * KiB
        src = fast.create_buffer(n * size)
        view(src)[:] = np.arange(n * size, dtype=np.uint64).astype(np.uint8)
        keys = [uniq("mix") for _ in range(n)]
        raise_for_results(fast.put(keys, [src.slice(i * size, size) for i in range(n)]))
        got = slow.get(keys)  # inline, over gRPC, possibly from the other daemon
        assert [r.data for r in got] == [src.memoryview(i * size, size).tobytes()
                                         for i in range(n)]
        inline = fast.get(keys[:1])  # inline data never takes the fast channel
        assert inline[0].data == got[0].data
        lease = fast.match_prefix(keys, lease_ttl_ms=5000)
        assert lease.matched == n
        dst = fast.create_buffer(size)
        assert fast.get(keys[:1], into=[dst.slice(0, size)], lease=lease)[0].ok
        lease.release()
        assert dst.memoryview().tobytes() == got[0].data
        stats = fast.transport_stats()
        assert stats["grpc"] == 1 and stats["fast"] == 4, stats


def test_unregistered_buffer_and_errors_match_grpc(cluster, fast_socket):
    """The same bad request answers the same error over both paths."""
    outcomes = []
    for fast in (None, False):
        with Client("unix:" + unix(cluster, 0), timeout_s=30, fast_channel=fast) as c:
            buf = c.create_buffer(4096)
            buffer_id = buf.id
            buf.close()  # unregistered now: the check below is the daemon's
            c._checker.sizes[buffer_id] = 4096  # let the request leave the client
            try:
                res = c.get([uniq("none")], into=[Slice(buffer_id, 0, 4096)])
                outcomes.append(("item", res[0].code))
            except StoreError as e:
                outcomes.append(("call", type(e), e.code))
            assert c.transport_stats()["fast"] == (1 if fast is None else 0)
    assert outcomes[0] == outcomes[1] and outcomes[0] != ("item", Code.OK), outcomes


def test_session_lost_over_the_fast_channel(cluster, fast_socket):
    """The daemon ends the fd session (its socket closes) while the client still holds the
    owner token: the next fast call raises SessionLostError, the client forgets the session and
    its connections, and a new buffer opens a new session whose calls go fast again."""
    from mcstore import SessionLostError
    with Client("unix:" + unix(cluster, 0), timeout_s=30) as c:
        buf = c.create_buffer(64 * KiB)
        key = uniq("lost")
        pattern = bytes(range(256)) * 16
        buf.memoryview(0, 4 * KiB)[:] = pattern
        raise_for_results(c.put([key], [buf.slice(0, 4 * KiB)]))
        c._fd_session._sock.close()  # the daemon sees the session end; the client does not
        lost = []

        def session_lost():
            try:
                c.get([key], into=[buf.slice(4 * KiB, 4 * KiB)])
            except SessionLostError as e:
                lost.append(e)
            return bool(lost)
        harness.wait_until(session_lost, 10, interval_s=0.01, what="SessionLostError")
        assert "session lost" in str(lost[0])
        assert c._fd_session is None and c.transport_stats()["fast_connections"] == 0
        fast_before = c.transport_stats()["fast"]
        assert c.exist([key]) == [True]  # anonymous now
        again = c.create_buffer(64 * KiB)
        res = c.get([key], into=[again.slice(0, 4 * KiB)])
        raise_for_results(res)
        assert again.memoryview(0, 4 * KiB).tobytes() == pattern
        stats = c.transport_stats()
        assert stats["fast"] == fast_before + 2 and stats["grpc"] == 0, stats
