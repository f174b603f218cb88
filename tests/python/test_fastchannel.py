"""The Python client's fast channel (python/mcstore/_fastchannel.py) against a fake daemon in
this process (fake_daemon.py: gRPC Store service, fd socket and fast socket): ATTACH with and
without the fd session's owner token, the daemon's limit, routing (what goes over the fast
channel, what over gRPC), the call_id check, timeouts, a daemon closing mid-call (no resend),
fallback when the socket is missing or refuses, error mapping identical to gRPC's (SessionLost
included), the bounded pool, and that close() gives every connection and fd back."""

import concurrent.futures
import logging
import os
import threading
import time

import grpc
import pytest

from mcstore import Client, Code, SessionLostError, StoreError, UnavailableError
from mcstore import _errors, _fastchannel
from mcstore.v1 import store_pb2

from integration import harness

import fake_daemon
from fake_daemon import FAILED_PRECONDITION, RESOURCE_EXHAUSTED, FakeDaemon


@pytest.fixture
def daemon(monkeypatch):
    monkeypatch.delenv("MCSTORE_FAST_SOCKET", raising=False)
    d = FakeDaemon()
    yield d
    d.close()


def wait_for(cond, what, timeout_s=10.0):
    harness.wait_until(cond, timeout_s, interval_s=0.01, what=what)


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_anonymous_calls_go_over_the_fast_channel(daemon):
    with Client(daemon.address) as c:
        assert c.exist([b"a", b"b"]) == [True, True]
        assert c.remove([b"a"])[0].ok
        assert c.put([b"k"], [b"small"])[0].ok
        lease = c.match_prefix([b"a", b"b"], lease_ttl_ms=1000)
        assert lease.matched == 2 and lease.lease_id == 7
        lease.release()
        stats = c.transport_stats()
        assert stats["fast"] == 5 and stats["grpc"] == 0, stats
        assert stats["fast_channel"] == daemon.sock + ".fast"
        assert stats["fast_limit"] == 262144 and stats["fast_connections"] == 1
    assert daemon.fast.attaches == [""]  # one connection, attached as the anonymous caller
    assert [n for n, _ in daemon.fast.calls] == ["BatchExist", "BatchRemove", "BatchPut",
                                                 "MatchPrefix", "ReleaseLease"]
    assert daemon.grpc_calls == []


def test_session_calls_attach_with_its_owner_token(daemon):
    with Client(daemon.address) as c:
        buf = c.create_buffer(1 << 16)  # opens the fd session; RegisterBuffer over gRPC
        owner = c._fd_session.owner
        res = c.get([b"x", b"y"], into=[buf.slice(0, 100), [buf.slice(100, 5), buf.slice(200, 7)]])
        assert [(r.ok, r.bytes_written) for r in res] == [(True, 100), (True, 12)]
        assert c.put([b"p"], [buf.slice(0, 64)])[0].ok
        prepared = c.prepare_slices([buf.slice(0, 10)])
        assert c.get([b"q"], into=[prepared])[0].bytes_written == 10
        layout = c.block_layout([(buf.slice(0, 16), 16)])
        assert all(r.ok for r in c.get([b"l1", b"l2"], into=layout.blocks([1, 2])))
        assert c.transport_stats()["fast"] == 4
    assert daemon.fast.attaches == [owner]
    assert all(o == owner for _, o in daemon.fast.calls)
    assert [n for n, _ in daemon.grpc_calls] == ["RegisterBuffer", "UnregisterBuffer"]


def test_inline_gets_and_oversize_requests_go_to_grpc(daemon):
    daemon.fast.close()
    daemon.start_fast(limit=8192)
    with Client(daemon.address) as c:
        assert c.get([b"inline"])[0].data == b"abc"  # inline data: gRPC
        assert daemon.grpc_calls_of("BatchGet") == 1 and daemon.fast.calls == []
        assert c.put([b"small"], [b"x" * 100])[0].ok  # fits: fast, and learns the limit
        assert c.transport_stats()["fast_limit"] == 8192
        assert c.put([b"big"], [b"x" * 9000])[0].ok  # over 8192: gRPC
        assert c.exist([b"k%d" % i for i in range(2000)])  # a 10 KiB request: gRPC
        assert daemon.fast.calls_of("BatchPut") == 1
        assert daemon.grpc_calls_of("BatchPut") == 1 and daemon.grpc_calls_of("BatchExist") == 1
        # A put's answer must fit as well: 70 items cannot promise it in 8 KiB.
        assert all(r.ok for r in c.put([b"k%d" % i for i in range(70)], [b"v"] * 70))
        assert daemon.grpc_calls_of("BatchPut") == 2
        stats = c.transport_stats()
        assert stats["fast_not_sent"]["oversize"] == 3 and stats["grpc"] == 4, stats
        # The *_async methods always use gRPC.
        assert c.exist_async([b"a"]).result() == [True]
        assert daemon.grpc_calls_of("BatchExist") == 2


def test_an_oversize_answer_of_a_read_is_asked_again_over_grpc(daemon):
    too_big = "answer of 300000 bytes exceeds the fast channel's limit of 262144 bytes"
    daemon.fast.behaviour = lambda name, req, cid: ("reply", RESOURCE_EXHAUSTED, too_big, b"")
    with Client(daemon.address) as c:
        assert c.exist([b"a"]) == [True]
        assert daemon.grpc_calls_of("BatchExist") == 1 and daemon.fast.calls_of("BatchExist") == 1
        # A put is never sent twice: the daemon may have stored it.
        with pytest.raises(StoreError) as info:
            c.put([b"k"], [b"v"])
        assert info.value.code is Code.NO_SPACE and "exceeds" in str(info.value)
        assert daemon.grpc_calls_of("BatchPut") == 0


def test_call_id_mismatch_is_an_error_and_drops_the_connection(daemon):
    daemon.fast.behaviour = lambda name, req, cid: (
        "reply", 0, "", store_pb2.BatchExistResponse(exists=[True]).SerializeToString(),
        cid + 1)
    with Client(daemon.address) as c:
        with pytest.raises(StoreError) as info:
            c.exist([b"a"])
        assert info.value.code is Code.INTERNAL and "answered call" in str(info.value)
        assert c.transport_stats()["fast_connections"] == 0
        assert daemon.grpc_calls == []  # no resend
        daemon.fast.behaviour = None
        assert c.exist([b"a"]) == [True]  # a fresh connection
    wait_for(lambda: daemon.fast.connections == 0, "the connections to close")


def test_timeout_raises_as_grpc_deadline_and_drops_the_connection(daemon):
    daemon.fast.behaviour = lambda name, req, cid: ("hang",)
    grpc_error = _errors.error_from_rpc(_FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                                      "Deadline Exceeded"), "BatchPut", "a")
    with Client(daemon.address) as c:
        start = time.monotonic()
        with pytest.raises(UnavailableError) as info:
            c.put([b"k"], [b"v"], timeout_s=0.3)
        assert time.monotonic() - start < 5
        assert type(info.value) is type(grpc_error) and info.value.code is grpc_error.code
        assert "no answer within the deadline" in str(info.value)
        assert c.transport_stats()["fast_connections"] == 0
        wait_for(lambda: daemon.fast.connections == 0, "the daemon to see the close")
        assert daemon.fast.calls_of("BatchPut") == 1 and daemon.grpc_calls == []


def test_a_timeout_below_a_microsecond_still_ends(daemon):
    """The kernel keeps the deadline (SO_RCVTIMEO), where a timeval of 0 means "never": a
    timeout too small for it must wait a microsecond, not forever."""
    with Client(daemon.address) as c:
        # The fast connection first, with a deadline it can keep: a 1e-9 s one can end the
        # attach itself (not sent fast: the call then goes over gRPC, which this fake answers).
        c.exist([b"a"])
        assert c.transport_stats()["fast_connections"] == 1
        daemon.fast.behaviour = lambda name, req, cid: ("hang",)
        start = time.monotonic()
        with pytest.raises(UnavailableError, match="no answer within the deadline"):
            c.exist([b"a"], timeout_s=1e-9)
        assert time.monotonic() - start < 5
        daemon.fast.behaviour = None
        assert c.exist([b"a"], timeout_s=5) == [True]  # a new connection, a new deadline


def _failing_item(name, req, cid):
    """Every item OK but the second: NOT_FOUND (get), ALREADY_EXISTS (put), HAS_LEASE
    (remove); a third get item short of bytes."""
    if name not in ("BatchGet", "BatchPut", "BatchRemove"):
        return None
    resp = fake_daemon.answer(name, req)
    resp.results[1].code = {"BatchGet": store_pb2.NOT_FOUND, "BatchPut": store_pb2.ALREADY_EXISTS,
                            "BatchRemove": store_pb2.HAS_LEASE}[name]
    if name == "BatchGet":
        resp.results[2].bytes_written -= 1
    return ("reply", 0, "", resp.SerializeToString())


def test_a_failed_item_in_an_answer_is_never_reported_ok(daemon):
    daemon.fast.behaviour = _failing_item
    with Client(daemon.address) as c:
        buf = c.create_buffer(1 << 16)
        layout = c.block_layout([(buf.slice(0, 16), 16)])
        keys = [b"a", b"b", b"c", b"d"]
        got = c.get(keys, into=layout.blocks([0, 1, 2, 3]))
        assert [r.code for r in got] == [Code.OK, Code.NOT_FOUND, Code.INTERNAL, Code.OK]
        assert "15 bytes written of 16" in got[2].message
        got = c.put(keys, layout.blocks([0, 1, 2, 3]))
        assert [r.code for r in got] == [Code.OK, Code.ALREADY_EXISTS, Code.OK, Code.OK]
        got = c.remove(keys)
        assert [r.code for r in got] == [Code.OK, Code.HAS_LEASE, Code.OK, Code.OK]
        daemon.fast.behaviour = None
        assert all(r.ok for r in c.get(keys, into=layout.blocks([0, 1, 2, 3])))
        assert c.transport_stats()["fast"] == 4 and daemon.grpc_calls_of("BatchGet") == 0


def test_daemon_closing_mid_call_is_unavailable_and_never_resent(daemon):
    daemon.fast.behaviour = lambda name, req, cid: ("close",)
    with Client(daemon.address) as c:
        with pytest.raises(UnavailableError, match="closed the fast channel"):
            c.put([b"k"], [b"v"])
        assert daemon.fast.calls_of("BatchPut") == 1
        assert daemon.grpc_calls_of("BatchPut") == 0
        assert c.transport_stats()["fast_not_sent"]["failed"] == 1


def test_idle_connection_closed_by_the_daemon_is_replaced_before_sending(daemon):
    with Client(daemon.address) as c:
        assert c.exist([b"a"]) == [True]
        daemon.fast.close()  # a restart: the pooled connection is dead, nothing was sent on it
        daemon.start_fast()
        assert c.exist([b"a"]) == [True]
        assert c.transport_stats()["fast_not_sent"]["stale"] == 1
        assert daemon.fast.calls_of("BatchExist") == 1 and daemon.grpc_calls == []


def test_missing_socket_falls_back_to_grpc_and_is_retried_later(daemon, monkeypatch, caplog):
    daemon.fast.close()
    caplog.set_level(logging.DEBUG, logger="mcstore")
    with Client(daemon.address) as c:  # auto: the socket is not there
        assert c.exist([b"a"]) == [True] and c.exist([b"b"]) == [True]
        stats = c.transport_stats()
        assert stats["grpc"] == 2 and stats["fast"] == 0
        assert stats["fast_not_sent"]["connect_failed"] == 1  # tried once,
        assert stats["fast_not_sent"]["down"] == 1  # then left alone for a while
    assert sum("fast channel" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.setattr(_fastchannel, "RETRY_AFTER_S", 0.05)
    with Client(daemon.address) as c:
        assert c.exist([b"a"]) == [True]
        daemon.start_fast()
        wait_for(lambda: c.exist([b"a"]) and c.transport_stats()["fast"] > 0,
                 "the fast channel to be used once the socket is there")


def test_fast_channel_off_explicit_path_and_env(daemon, monkeypatch):
    with Client(daemon.address, fast_channel=False) as c:
        assert c.exist([b"a"]) == [True]
        assert c.transport_stats()["fast_channel"] is None
    with Client("127.0.0.1:1", fast_channel=daemon.sock + ".fast") as c:
        assert c.exist([b"a"]) == [True]  # fast even for a TCP address
    monkeypatch.setenv("MCSTORE_FAST_SOCKET", "off")
    with Client(daemon.address) as c:
        assert c.exist([b"a"]) == [True]
    monkeypatch.setenv("MCSTORE_FAST_SOCKET", daemon.sock + ".fast")
    with Client("127.0.0.1:1") as c:
        assert c.exist([b"a"]) == [True]
    assert daemon.fast.calls_of("BatchExist") == 2 and daemon.grpc_calls_of("BatchExist") == 2
    with pytest.raises(TypeError):
        Client(daemon.address, fast_channel=3)


def test_refused_attach_falls_back_to_grpc(daemon):
    daemon.fast.refuse_attach = True
    with Client(daemon.address) as c:
        assert c.exist([b"a"]) == [True]
        assert c.transport_stats()["fast_not_sent"]["connect_failed"] == 1
    assert daemon.fast.calls == [] and daemon.grpc_calls_of("BatchExist") == 1


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, lost=False):
        self._code, self._details, self._lost = code, details, lost

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return (("x-mc-error", "session-lost"),) if self._lost else ()


@pytest.mark.parametrize("status", [
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS])
def test_errors_map_exactly_as_grpc_errors(daemon, status):
    daemon.fast.behaviour = lambda name, req, cid: ("reply", status.value[0], "why not", b"")
    want = _errors.error_from_rpc(_FakeRpcError(status, "why not"), "BatchRemove",
                                  daemon.address)
    with Client(daemon.address) as c:
        with pytest.raises(StoreError) as info:
            c.remove([b"k"])
    got = info.value
    assert (type(got), got.code, str(got)) == (type(want), want.code, str(want))
    assert daemon.grpc_calls == []


def test_session_lost_forgets_the_session_and_its_connections(daemon):
    with Client(daemon.address) as c:
        buf = c.create_buffer(4096)
        old = c._fd_session.owner
        assert c.get([b"k"], into=[buf.slice(0, 10)])[0].ok
        daemon.fast.behaviour = lambda name, req, cid: (
            "reply", FAILED_PRECONDITION, "session lost: owner %s is not a live session" % old,
            b"")
        with pytest.raises(SessionLostError) as info:
            c.get([b"k"], into=[buf.slice(0, 10)])
        want = _errors.error_from_rpc(
            _FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION,
                          "session lost: owner %s is not a live session" % old, lost=True),
            "BatchGet", daemon.address)
        assert (info.value.code, str(info.value)) == (want.code, str(want))
        assert c._fd_session is None  # forgotten, as after gRPC's SessionLost
        assert c.transport_stats()["fast_connections"] == 0
        wait_for(lambda: daemon.fast.connections == 0, "the old session's connections to close")
        daemon.fast.behaviour = None
        assert c.exist([b"a"]) == [True]  # anonymous now
        buf2 = c.create_buffer(4096)  # a new session: connections attach with its token
        assert c.get([b"k"], into=[buf2.slice(0, 10)])[0].ok
        new = c._fd_session.owner
    assert new != old
    assert daemon.fast.attaches == [old, "", new]


def test_attach_of_a_session_the_daemon_lost_falls_back_to_grpc(daemon):
    with Client(daemon.address) as c:
        buf = c.create_buffer(4096)
        daemon.fd.end_sessions()
        assert c.get([b"k"], into=[buf.slice(0, 10)])[0].ok  # the fake's gRPC forgives
        assert daemon.grpc_calls_of("BatchGet") == 1
        assert c.transport_stats()["fast_not_sent"]["connect_failed"] == 1


def test_pool_is_bounded_and_close_gives_everything_back(daemon):
    gate = threading.Event()

    def slow(name, req, cid):
        gate.wait(10)
        return None
    base = open_fds()
    c = Client(daemon.address)
    daemon.fast.behaviour = slow
    n = 10
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        calls = [pool.submit(c.exist, [b"k%d" % i]) for i in range(n)]
        wait_for(lambda: len(daemon.fast.calls) == _fastchannel.MAX_CONNECTIONS,
                 "the pool to fill")
        wait_for(lambda: daemon.grpc_calls_of("BatchExist") == n - _fastchannel.MAX_CONNECTIONS,
                 "the rest to go over gRPC")
        gate.set()
        assert all(f.result() == [True] for f in calls)
    assert daemon.fast.max_connections == _fastchannel.MAX_CONNECTIONS
    stats = c.transport_stats()
    assert stats["fast"] == 4 and stats["grpc"] == n - 4
    assert stats["fast_not_sent"]["busy"] == n - 4
    assert stats["fast_connections"] == _fastchannel.MAX_CONNECTIONS
    c.close()
    assert c.transport_stats()["fast_connections"] == 0
    wait_for(lambda: daemon.fast.connections == 0, "the daemon to see every connection close")
    wait_for(lambda: open_fds() <= base, "the fds to be given back")


def test_fast_connections_sets_the_pool_bound(daemon):
    gate = threading.Event()

    def slow(name, req, cid):
        gate.wait(10)
        return None
    with pytest.raises(ValueError):
        Client(daemon.address, fast_connections=0)
    with pytest.raises(ValueError):
        Client(daemon.address, fast_connections=65)
    c = Client(daemon.address, fast_connections=2)
    daemon.fast.behaviour = slow
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        calls = [pool.submit(c.exist, [b"k%d" % i]) for i in range(5)]
        wait_for(lambda: len(daemon.fast.calls) == 2, "two fast calls")
        wait_for(lambda: daemon.grpc_calls_of("BatchExist") == 3, "the rest over gRPC")
        gate.set()
        assert all(f.result() == [True] for f in calls)
    assert c.transport_stats()["fast_connections"] == 2
    c.close()
    wait_for(lambda: daemon.fast.connections == 0, "the daemon to see every connection close")


def test_one_connection_serves_many_calls(daemon):
    with Client(daemon.address) as c:
        for _ in range(200):
            assert c.exist([b"a"]) == [True]
        assert c.transport_stats()["fast_connections"] == 1
    assert daemon.fast.attaches == [""]


def test_a_limit_outside_the_range_is_not_used(daemon):
    daemon.fast.close()
    daemon.start_fast(limit=100)  # below 4096: a daemon this client cannot trust
    with Client(daemon.address) as c:
        assert c.exist([b"a"]) == [True]
        assert c.transport_stats()["fast_not_sent"]["connect_failed"] == 1
    assert daemon.fast.calls == [] and daemon.grpc_calls_of("BatchExist") == 1


def test_an_unreadable_header_answer_is_the_daemons_error(daemon):
    daemon.fast.behaviour = lambda name, req, cid: ("reply", 3, "bad magic", b"", 0)
    with Client(daemon.address) as c:
        with pytest.raises(StoreError) as info:
            c.exist([b"a"])
    assert info.value.code is Code.INVALID_ARGUMENT and "bad magic" in str(info.value)


def test_a_forked_child_opens_its_own_connection(daemon):
    with Client(daemon.address) as c:
        assert c.exist([b"a"]) == [True]
        pid = os.fork()
        if pid == 0:  # the child: its copy of the parent's connection is closed, not shared
            code = 1
            try:
                stats = c.transport_stats()
                ok = c.exist([b"b"]) == [True]
                code = 0 if ok and stats["fast_connections"] == 0 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert c.exist([b"c"]) == [True]  # the parent's connection is still its own
        assert c.transport_stats()["fast_connections"] == 1
    assert daemon.fast.attaches == ["", ""]
    assert daemon.grpc_calls == []
