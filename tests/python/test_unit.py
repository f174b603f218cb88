"""Unit tests of the mcstore client that need no daemon: the Code enum against the proto, error
formatting and gRPC mapping, input validation (keys, values, slices), and shared-memory buffer
views."""

import concurrent.futures
import gc
import os
import pickle

import grpc
import numpy as np
import pytest

import mcstore
from mcstore import (Client, Code, GetResult, LeaseRef, Result, SharedBuffer, Slice,
                     StoreError, UnavailableError)
from mcstore import _answers, _channel, _core, _errors
from mcstore._buffers import check_shm_name
from mcstore.v1 import store_pb2


# -- codes and errors ---------------------------------------------------------------------------
def test_code_mirrors_proto_enum():
    proto = {v.name: v.number for v in store_pb2.DESCRIPTOR.enum_types_by_name["Code"].values}
    assert {c.name: int(c) for c in Code} == proto


def test_unknown_wire_code_is_internal():
    assert Code.from_wire(999) is Code.INTERNAL
    assert Code.from_wire(6) is Code.SIZE_MISMATCH


def test_store_error_names_code_key_and_address():
    e = StoreError(Code.NOT_FOUND, "no such key", key=b"k1", address="unix:/x.sock")
    assert str(e).startswith("NOT_FOUND: no such key")
    assert "'k1'" in str(e) and "unix:/x.sock" in str(e)
    assert e.code is Code.NOT_FOUND
    binary = StoreError(Code.INTERNAL, "m", key=b"\xff\x00")
    assert "0xff00" in str(binary)
    u = UnavailableError("down", address="h:1")
    assert isinstance(u, StoreError) and u.code is Code.UNAVAILABLE
    assert str(u).startswith("UNAVAILABLE: down")
    again = pickle.loads(pickle.dumps(u))
    assert type(again) is UnavailableError and str(again) == str(u)


def test_result_raise_for_status():
    Result(Code.OK).raise_for_status()
    with pytest.raises(StoreError, match="ALREADY_EXISTS.*'k'") as info:
        Result(Code.ALREADY_EXISTS, "exists", b"k").raise_for_status()
    assert info.value.code is Code.ALREADY_EXISTS
    g = GetResult(Code.SIZE_MISMATCH, "slices hold 3 bytes", b"k", size=9)
    assert not g.ok and g.size == 9 and g.data is None
    with pytest.raises(StoreError, match="SIZE_MISMATCH"):
        mcstore.raise_for_results([Result(Code.OK), g])


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("status,code,unavailable", [
    (grpc.StatusCode.UNAVAILABLE, Code.UNAVAILABLE, True),
    (grpc.StatusCode.DEADLINE_EXCEEDED, Code.UNAVAILABLE, True),
    (grpc.StatusCode.INVALID_ARGUMENT, Code.INVALID_ARGUMENT, False),
    (grpc.StatusCode.NOT_FOUND, Code.NOT_FOUND, False),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, Code.NO_SPACE, False),
    (grpc.StatusCode.OUT_OF_RANGE, Code.SIZE_MISMATCH, False),
    (grpc.StatusCode.DATA_LOSS, Code.CHECKSUM_MISMATCH, False),
    (grpc.StatusCode.UNIMPLEMENTED, Code.INTERNAL, False),
])
def test_rpc_errors_map_to_codes(status, code, unavailable):
    e = _errors.error_from_rpc(_FakeRpcError(status, "details here"), "BatchGet", "h:7")
    assert e.code is code
    assert isinstance(e, UnavailableError) == unavailable
    assert "BatchGet" in str(e) and "details here" in str(e) and "h:7" in str(e)


# -- answers that do not match the request ---------------------------------------------------
def test_answer_with_missing_results_raises():
    resp = store_pb2.BatchPutResponse(results=[store_pb2.Result(code=0)])
    with pytest.raises(StoreError, match="1 results for 2 items"):
        _answers.parse_results(resp, [b"a", b"b"], "BatchPut", "h:1")
    with pytest.raises(StoreError, match="INTERNAL"):
        _answers.parse_get(store_pb2.BatchGetResponse(), [b"a"], [None], "h:1")
    with pytest.raises(StoreError):
        _answers.parse_exist(store_pb2.BatchExistResponse(exists=[True]), [], "h:1")


def test_ok_get_answers_are_checked_byte_for_byte():
    R = store_pb2.GetResult
    resp = store_pb2.BatchGetResponse(results=[
        R(code=0, size=3, bytes_written=3, data=b"abc"),   # fine, inline
        R(code=0, size=4, bytes_written=4, data=b"abc"),   # inline bytes short
        R(code=0, size=8, bytes_written=8),                # into slices of 8: fine
        R(code=0, size=8, bytes_written=5),                # not all written
        R(code=0, size=6, bytes_written=6),                # object smaller than the slices
        R(code=6, message="slices hold 2 bytes", size=8),  # daemon's SIZE_MISMATCH
    ])
    out = _answers.parse_get(resp, [b"k%d" % i for i in range(6)], [None, None, 8, 8, 8, 2], "h")
    assert [r.code for r in out] == [Code.OK, Code.INTERNAL, Code.OK, Code.INTERNAL,
                                     Code.INTERNAL, Code.SIZE_MISMATCH]
    assert out[0].data == b"abc" and out[1].data is None and out[2].data is None
    assert out[5].size == 8 and "slices hold" in out[5].message


def test_match_answer_checked():
    resp = store_pb2.MatchPrefixResponse(matched=3, keys_seen=2)
    with pytest.raises(StoreError, match="3 matched of 2"):
        _answers.parse_match(resp, [b"a", b"b"], 0, "h")
    resp = store_pb2.MatchPrefixResponse(matched=1, keys_seen=1, lease_id=0)
    with pytest.raises(StoreError, match="no lease"):
        _answers.parse_match(resp, [b"a"], 1000, "h")


# -- input validation before anything is sent ----------------------------------------------
@pytest.fixture
def dead_client():
    c = Client("127.0.0.1:1", timeout_s=2)  # nothing listens: bad input must fail before that
    yield c
    c.close()


def test_keys_must_be_bytes_or_str(dead_client):
    with pytest.raises(TypeError, match="key must be bytes or str"):
        dead_client.exist([1])
    with pytest.raises(TypeError, match="wrap it in a list"):
        dead_client.exist(b"abc")
    assert _core.encode_keys(["é", b"x"]) == ["é".encode(), b"x"]


def test_put_values_validated(dead_client):
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        dead_client.put([b"a", b"b"], [b"x"])
    with pytest.raises(TypeError, match="not str"):
        dead_client.put([b"a"], ["text"])
    with pytest.raises(TypeError, match="unsupported value type"):
        dead_client.put([b"a"], [3.5])
    with pytest.raises(ValueError, match="not C-contiguous"):
        dead_client.put([b"a"], [np.zeros((4, 4))[:, ::2]])
    with pytest.raises(TypeError, match="Python objects"):
        dead_client.put([b"a"], [np.array([object()])])
    with pytest.raises(ValueError, match="empty list of slices"):
        dead_client.put([b"a"], [[]])
    with pytest.raises(TypeError, match="mixes Slices"):
        dead_client.put([b"a"], [[Slice(1, 0, 1), b"x"]])
    with pytest.raises(ValueError, match="replicas"):
        dead_client.put([b"a"], [b"x"], replicas=0)
    with pytest.raises(TypeError, match="one value per key"):
        dead_client.put([b"a"], b"x")


def test_inline_values_bytes():
    assert _core.inline_bytes(np.arange(3, dtype=np.uint16), "v") == b"\x00\x00\x01\x00\x02\x00"
    assert _core.inline_bytes(memoryview(b"abc"), "v") == b"abc"
    assert _core.inline_bytes(bytearray(b"ab"), "v") == b"ab"
    with pytest.raises(ValueError, match="not C-contiguous"):
        _core.inline_bytes(memoryview(np.zeros((4, 4))[:, ::2]), "v")


def test_slices_of_unknown_buffers_rejected(dead_client):
    with pytest.raises(ValueError, match="not registered through this client"):
        dead_client.get([b"a"], into=[[Slice(7, 0, 10)]])
    with pytest.raises(ValueError, match="1 keys but 2 destinations"):
        dead_client.get([b"a"], into=[None, None])
    with pytest.raises(TypeError, match="into"):
        dead_client.get([b"a"], into=[b"not a slice"])
    with pytest.raises(TypeError, match="lease"):
        dead_client.get([b"a"], lease="x")


def test_slice_fields_checked():
    with pytest.raises(ValueError, match=">= 0"):
        Slice(1, -1, 4)
    with pytest.raises(TypeError, match="must be an int"):
        Slice(1, 0.5, 4)
    assert Slice(1, np.int64(2), 3).offset == 2


def test_shm_names_checked():
    assert check_shm_name("/kv-0") == "/kv-0"
    for bad in ("kv", "/", "/a/b", "/" + "x" * 300):
        with pytest.raises(ValueError, match="bad shm name"):
            check_shm_name(bad)


def test_address_forms():
    assert _channel.channel_target("unix:/run/x.sock") == "unix:/run/x.sock"
    assert _channel.channel_target("/run/x.sock") == "unix:/run/x.sock"
    assert _channel.channel_target("127.0.0.1:5") == "127.0.0.1:5"
    with pytest.raises(ValueError, match="no port"):
        _channel.channel_target("localhost")
    with pytest.raises(ValueError):
        Client("")


def test_daemon_down_is_unavailable_with_address(dead_client):
    with pytest.raises(UnavailableError, match="127.0.0.1:1") as info:
        dead_client.exist([b"a"])
    assert info.value.code is Code.UNAVAILABLE and info.value.address == "127.0.0.1:1"
    with pytest.raises(UnavailableError):
        dead_client.get_async([b"a"]).result(timeout=10)
    # Buffers travel as fds over the daemon's fd socket: a TCP client needs to be told where.
    with pytest.raises(StoreError, match="fd socket") as info:
        dead_client.create_buffer(4096)
    assert info.value.code is Code.INVALID_ARGUMENT
    c = Client("127.0.0.1:1", timeout_s=2, fd_socket="/nonexistent/mc.sock.fd")
    try:
        with pytest.raises(UnavailableError, match="fd socket"):
            c.create_buffer(4096)
    finally:
        c.close()


def test_token_goes_in_the_metadata(tmp_path, monkeypatch):
    tok = tmp_path / "tok"
    tok.write_text("  " + "t" * 40 + "\n")
    tok.chmod(0o644)
    monkeypatch.setenv("MCSTORE_TOKEN_FILE", str(tok))
    with pytest.raises(PermissionError, match="chmod 600"):
        Client("127.0.0.1:1")
    tok.chmod(0o600)
    c = Client("127.0.0.1:1")
    assert ("authorization", "Bearer " + "t" * 40) in c._metadata()
    c.close()
    c = Client("127.0.0.1:1", token="abc")
    assert c._metadata() == (("authorization", "Bearer abc"),)
    c.close()
    monkeypatch.delenv("MCSTORE_TOKEN_FILE")
    c = Client("unix:/run/x.sock")
    assert c._metadata() == () and c.fd_socket == "/run/x.sock.fd"
    c.close()


def test_tls_config_checks_its_files(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")  # read only when a channel is made
    with pytest.raises(ValueError, match="ca_file"):
        mcstore.TlsConfig(ca_file="")
    with pytest.raises(ValueError, match="go together"):
        mcstore.TlsConfig(ca_file=str(ca), cert_file=str(ca))
    key = tmp_path / "k.pem"
    key.write_text("key")
    key.chmod(0o644)
    loose = mcstore.TlsConfig(ca_file=str(ca), cert_file=str(ca), key_file=str(key))
    with pytest.raises(PermissionError, match="chmod 600"):
        Client("127.0.0.1:1", tls=loose)
    with pytest.raises(ValueError, match="Unix socket"):
        Client("unix:/run/x.sock", tls=str(ca))
    with pytest.raises(TypeError):
        Client("127.0.0.1:1", tls=42)
    c = Client("127.0.0.1:1", tls=str(ca))  # the CA path alone: server-side TLS
    assert c.tls == mcstore.TlsConfig(ca_file=str(ca))
    c.close()
    assert mcstore.TlsConfig(ca_file=str(ca), server_name="m").channel_options() == [
        ("grpc.ssl_target_name_override", "m")]


def test_closed_client_refuses(dead_client):
    dead_client.close()
    with pytest.raises(ValueError, match="closed"):
        dead_client.exist([b"a"])


# -- shared buffers (with a fake registry: no daemon) ------------------------------------------
class FakeOwner:
    def __init__(self):
        self.registered, self.unregistered, self.next = {}, [], 1

    def register(self, name, size):
        assert os.path.exists("/dev/shm" + name)
        self.registered[self.next] = (name, size)
        self.next += 1
        return self.next - 1

    def unregister(self, buffer_id):
        self.unregistered.append(buffer_id)

    def buffer(self, n):
        return SharedBuffer(n, self.register, self.unregister, self)


def test_buffer_is_private_shm_and_closes():
    owner = FakeOwner()
    b = owner.buffer(8192)
    path = "/dev/shm" + b.name
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert b.name.startswith("/mcstore-%d-" % os.getpid())
    assert owner.registered[b.id] == (b.name, 8192)
    b.close()
    b.close()  # idempotent
    assert owner.unregistered == [b.id] and not os.path.exists(path)
    with pytest.raises(ValueError, match="closed"):
        b.numpy(np.uint8, 4)
    with pytest.raises(ValueError, match="closed"):
        b.slice(0, 4)


def test_buffer_freed_when_garbage_collected():
    owner = FakeOwner()
    b = owner.buffer(4096)
    path, bid = "/dev/shm" + b.name, b.id
    del b
    gc.collect()
    assert not os.path.exists(path) and owner.unregistered == [bid]


def test_numpy_views_share_memory():
    owner = FakeOwner()
    with owner.buffer(4096) as b:
        a = b.numpy(np.float32, (4, 8), offset=64)
        a[:] = 1.5
        assert bytes(b.memoryview(64, 4)) == np.float32(1.5).tobytes()
        s = b.slice_of(a)
        assert (s.buffer_id, s.offset, s.length) == (b.id, 64, 128)
        row = b.slice_of(a[2])
        assert (row.offset, row.length) == (64 + 64, 32)
        other = np.zeros(8, np.float32)
        with pytest.raises(ValueError, match="does not lie inside"):
            b.slice_of(other)
        with pytest.raises(ValueError, match="not C-contiguous"):
            b.slice_of(a[:, ::2])
        with pytest.raises(TypeError, match="numpy array or a torch tensor"):
            b.slice_of(b"abc")
    # The view outlives close(): the mapping stays until the view goes, never dangling.
    assert float(a.sum()) == 1.5 * 32


def test_numpy_view_bad_input():
    owner = FakeOwner()
    with owner.buffer(4096) as b:
        with pytest.raises(ValueError, match="outside shared buffer"):
            b.numpy(np.float64, 513)
        with pytest.raises(ValueError, match="outside"):
            b.numpy(np.uint8, 1, offset=4096)
        with pytest.raises(ValueError, match="not aligned"):
            b.numpy(np.float32, 2, offset=2)
        with pytest.raises(TypeError, match="not a numpy dtype|cannot live"):
            b.numpy("not-a-dtype", 2)
        with pytest.raises(TypeError, match="cannot live"):
            b.numpy(object, 2)
        with pytest.raises(ValueError, match="negative"):
            b.numpy(np.uint8, (-1, 2))
        with pytest.raises(ValueError, match="outside"):
            b.slice(4000, 97)
        with pytest.raises(ValueError, match="outside"):
            Slice(b.id, 4097, 0, b)
        assert b.slice(4000).length == 96
    with pytest.raises(ValueError, match="at least 1 byte"):
        owner.buffer(0)


def test_slices_checked_against_owner_and_bounds():
    owner_a = Client("127.0.0.1:1")
    owner_b = FakeOwner()
    try:
        foreign = owner_b.buffer(4096)
        checker = _core.SliceChecker(owner_a)
        with pytest.raises(ValueError, match="another client"):
            checker.check(foreign.slice(0, 16), "x")
        checker.sizes[5] = 100
        checker.check(Slice(5, 0, 100), "x")
        with pytest.raises(ValueError, match="outside buffer 5"):
            checker.check(Slice(5, 50, 51), "x")
        foreign.close()
    finally:
        owner_a.close()


def test_torch_views():
    torch = pytest.importorskip("torch")
    owner = FakeOwner()
    with owner.buffer(4096) as b:
        t = b.torch(torch.float16, (8, 16), offset=256)
        t.fill_(2.0)
        assert b.numpy(np.float16, (8, 16), offset=256).sum() == 2.0 * 128
        s = b.slice_of(t[1:3])
        assert (s.offset, s.length) == (256 + 32, 64)
        with pytest.raises(ValueError, match="not contiguous"):
            b.slice_of(t.t())
        with pytest.raises(ValueError, match="not contiguous"):
            _core.inline_bytes(t.t(), "v")
        assert _core.inline_bytes(t[0], "v") == b.memoryview(256, 32).tobytes()
        with pytest.raises(TypeError, match="torch.dtype"):
            b.torch(np.float16, 4)
        with pytest.raises(ValueError, match="not aligned"):
            b.torch(torch.float32, 4, offset=2)
        with pytest.raises(ValueError, match="outside"):
            b.torch(torch.float32, 1025)
    assert float(t.float().sum()) == 256.0  # still mapped while the tensor lives


def test_buffer_pool_blocks():
    owner = FakeOwner()
    owner.create_buffer = owner.buffer
    pool = mcstore.BufferPool(owner, block_size=1024, blocks=3)
    a, b, c = pool.acquire(), pool.acquire(), pool.acquire()
    assert sorted(x.index for x in (a, b, c)) == [0, 1, 2] and pool.free_blocks() == 0
    with pytest.raises(TimeoutError):
        pool.acquire(timeout=0.05)
    s = b.slice(16, 100)
    assert (s.buffer_id, s.offset, s.length) == (pool.buffer.id, b.offset + 16, 100)
    v = b.numpy(np.uint32, 256)
    assert pool.buffer.slice_of(v).offset == b.offset
    with pytest.raises(ValueError, match="outside a pool block"):
        b.slice(1000, 100)
    with pytest.raises(ValueError, match="outside"):
        b.numpy(np.uint32, 257)
    b.release()
    with pytest.raises(ValueError, match="released"):
        b.slice(0, 1)
    with pool.acquire(timeout=1) as again:
        assert again.index == b.index
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        pool.acquire(timeout=1)


def test_wheel_build_generates_stubs(tmp_path):
    """pip builds a wheel whose mcstore/v1 stubs come from proto/ (the setup.py hook), from a copy
    of python/ and proto/ so the source tree stays clean."""
    import shutil
    import subprocess
    import sys
    import zipfile
    pytest.importorskip("grpc_tools")
    pytest.importorskip("setuptools")
    src = os.environ.get("MC_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
    shutil.copytree(os.path.join(src, "python"), tmp_path / "python",
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "v1"))
    shutil.copytree(os.path.join(src, "proto"), tmp_path / "proto")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation",
                        "--no-deps", "--no-index", "-w", str(tmp_path / "dist"),
                        str(tmp_path / "python")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    [wheel] = list((tmp_path / "dist").glob("mcstore-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for f in ("mcstore/v1/store_pb2.py", "mcstore/v1/store_pb2_grpc.py", "mcstore/v1/__init__.py",
              "mcstore/_client.py", "mcstore/py.typed"):
        assert f in names


def test_async_client_bad_input_and_daemon_down():
    import asyncio

    async def main():
        async with mcstore.AsyncClient("127.0.0.1:1", timeout_s=5) as a:
            with pytest.raises(ValueError, match="2 keys but 1 values"):
                await a.put([b"a", b"b"], [b"x"])
            with pytest.raises(ValueError, match="not registered"):
                await a.get([b"a"], into=[Slice(3, 0, 1)])
            with pytest.raises(UnavailableError, match="127.0.0.1:1") as info:
                await a.get([b"a"])
            assert info.value.code is Code.UNAVAILABLE
            with pytest.raises(UnavailableError):
                await a.match_prefix([b"a"], lease_ttl_ms=100)
            with pytest.raises(StoreError, match="fd socket"):  # TCP: where to pass fds?
                await a.create_buffer(4096)
        with pytest.raises(ValueError, match="closed"):
            await a.exist([b"a"])

    asyncio.run(main())


def test_layout_batches_are_written_as_the_same_bytes_as_messages():
    """A batch of one BlockLayout's blocks is written as bytes by hand; they must be exactly
    what protobuf writes for the same request (runs once, one LayoutBlock per item), and
    BlockLayout.slices(i) must be what the daemon expands block i into."""
    owner = FakeOwner()
    with owner.buffer(1 << 20) as b:
        checker = _core.SliceChecker(owner)
        big = 1 << 40
        checker.sizes[77] = big
        runs = [(b.slice(0, 100), 1000), (Slice(77, 5, 300), 1 << 20), (b.slice(500, 0), 0),
                (Slice(77, big - (1 << 30), 7), 0)]
        layout = _core.BlockLayout(runs, checker)
        assert layout.block_length == 407 and layout.num_blocks == ((1 << 20) - 100) // 1000 + 1
        keys = [b"", b"k" * 200, b"x", b"y", b"z"]
        indices = [0, 1, 127, 128, layout.num_blocks - 1]
        for lease in (None, 1, (1 << 64) - 1, (5, b"\x01" * 16), LeaseRef(1 << 40, b"t" * 16)):
            raw, bkeys, lengths = _core.build_get(keys, layout.blocks(indices), lease, checker)
            lease_id, token = _core.lease_of(lease)
            ref = store_pb2.BatchGetRequest(lease_id=lease_id, lease_token=token)
            for k, i in zip(keys, indices):
                ref.items.add(key=k).block.index = i
            for (sl, st) in runs:
                ref.block_layout.add(buffer_id=sl.buffer_id, offset=sl.offset,
                                     length=sl.length, stride=st)
            assert type(raw) is bytes and raw == ref.SerializeToString()
            assert store_pb2.BatchGetRequest.FromString(raw) == ref
            assert lengths == [407] * len(keys) and bkeys == keys
        for replicas in (None, 3):
            raw, _ = _core.build_put(keys, layout.blocks(indices), replicas, checker)
            ref = store_pb2.BatchPutRequest(replicas=replicas or 0)
            for k, i in zip(keys, indices):
                ref.items.add(key=k).block.index = i
            ref.block_layout.extend(store_pb2.BatchGetRequest.FromString(
                _core.build_get([], layout.blocks([]), None, checker)[0]).block_layout)
            assert raw == ref.SerializeToString()
        assert layout.slices(3) == [Slice(b.id, 3000, 100), Slice(77, 5 + 3 * (1 << 20), 300),
                                    Slice(b.id, 500, 0), Slice(77, big - (1 << 30), 7)]
        # bad input, refused before anything is sent
        with pytest.raises(ValueError, match="block 1049 outside"):
            layout.blocks([1, layout.num_blocks])
        with pytest.raises(TypeError, match="must be an int"):
            layout.blocks([1, True])
        with pytest.raises(TypeError, match="must be an int, got float"):
            layout.blocks([1.0])
        assert layout.blocks(np.arange(3, 6)).indices == (3, 4, 5)   # numpy ints are ints
        # Checked once, then fixed: a request is written from them without checking again.
        source = [0, 1]
        blocks = layout.blocks(source)
        source[0] = -1
        assert blocks.indices == (0, 1)
        with pytest.raises(TypeError):
            blocks.indices[0] = -1  # type: ignore[index]
        with pytest.raises(AttributeError):
            blocks.indices = (-1, 1)  # type: ignore[misc]
        with pytest.raises(AttributeError):
            blocks.layout = layout  # type: ignore[misc]
        with pytest.raises(TypeError, match="sequence of ints"):
            layout.blocks(3)
        with pytest.raises(ValueError, match="2 keys but 1 blocks"):
            _core.build_get([b"a", b"b"], layout.blocks([1]), None, checker)
        with pytest.raises(ValueError, match="no runs"):
            _core.BlockLayout([], checker)
        with pytest.raises(TypeError, match="stride"):
            _core.BlockLayout([(b.slice(0, 1), 1.5)], checker)
        with pytest.raises(ValueError, match="stride -1"):
            _core.BlockLayout([(b.slice(0, 1), -1)], checker)
        with pytest.raises(TypeError, match="Slice of block 0, stride"):
            _core.BlockLayout([b.slice(0, 1)], checker)
        with pytest.raises(ValueError, match="outside buffer"):
            _core.BlockLayout([(Slice(77, big, 1), 1)], checker)
        del checker.sizes[77]
        with pytest.raises(ValueError, match="no longer registered"):
            _core.build_put([b"a"], layout.blocks([0]), None, checker)
    with pytest.raises(ValueError, match="closed or re-registered"):
        _core.build_get([b"a"], layout.blocks([0]), None, checker)


def test_leases_are_named_by_id_and_capability():
    assert _core.lease_of(None) == (0, b"")
    assert _core.lease_of(7) == (7, b"")
    assert _core.lease_of(LeaseRef(7, b"t" * 16)) == (7, b"t" * 16)
    assert _core.lease_of((7, bytearray(b"x"))) == (7, b"x")
    assert _core.lease_of((7, None)) == (7, b"")
    for bad in (True, -1, 1.5, "7", (7, "token"), (7, b"t" * 65)):
        with pytest.raises((TypeError, ValueError)):
            _core.lease_of(bad)
    with pytest.raises(ValueError, match="64 bits"):
        _core.lease_of(1 << 64)


def test_slice_requests_carry_no_payload():
    owner = FakeOwner()
    with owner.buffer(4 << 20) as b:
        checker = _core.SliceChecker(owner)
        put, _ = _core.build_put([b"k1", b"k2"], [b.slice(0, 2 << 20), [b.slice(2 << 20, 1 << 20),
                                                                      b.slice(3 << 20)]],
                                 None, checker)
        assert put.ByteSize() < 100 and all(not it.data for it in put.items)
        assert [len(it.slices) for it in put.items] == [1, 2]
        get, _, lengths = _core.build_get([b"k1", b"k2", b"k3"],
                                          [b.slice(0, 2 << 20), [b.slice(2 << 20)], None],
                                          7, checker)
        assert get.ByteSize() < 100 and get.lease_id == 7 and lengths == [2 << 20, 2 << 20, None]


def test_prepared_batches_are_written_as_the_same_bytes_as_messages():
    """A batch of PreparedSlices is written as bytes by hand (no message per item); the bytes
    must be exactly what protobuf writes for the same request, for any sizes and offsets."""
    owner = FakeOwner()
    with owner.buffer(1 << 20) as b:
        checker = _core.SliceChecker(owner)
        big = 1 << 40
        checker.sizes[77] = big   # a buffer registered by id (Client.register_buffer)
        rng = np.random.default_rng(11)
        geometries = [[b.slice(0, 1)], [b.slice(127, 129), b.slice(0, 0)],
                      [Slice(77, 0, 5), Slice(77, big - 300, 300), b.slice(1 << 19, 1 << 19)]]
        for _ in range(20):
            n = int(rng.integers(1, 6))
            geometries.append([Slice(77, int(o), int(ln)) for o, ln in
                               zip(rng.integers(0, big // 2, n), rng.integers(0, 1 << 30, n))])
        keys = [b"", b"k" * 200] + [os.urandom(int(rng.integers(1, 300)))
                                     for _ in geometries[2:]]
        prepared = [_core.PreparedSlices(g, checker) for g in geometries]
        for p, g in zip(prepared, geometries):
            msg = store_pb2.GetItem()
            for s in g:
                msg.slices.add(buffer_id=s.buffer_id, offset=s.offset, length=s.length)
            assert p._get_raw == msg.SerializeToString()
            assert p.length == sum(s.length for s in g) and p.count == len(g)
        for lease in (None, 1, 300, (1 << 64) - 1, LeaseRef(9, b"\xff" * 16)):
            raw, bkeys, lengths = _core.build_get(keys, prepared, lease, checker)
            ref, _, ref_lengths = _core.build_get(keys, geometries, lease, checker)
            assert type(raw) is bytes and raw == ref.SerializeToString()
            assert lengths == ref_lengths and bkeys == keys
            assert store_pb2.BatchGetRequest.FromString(raw) == ref
            assert _channel.serialize(raw) is raw and _channel.serialize(ref) == raw
        for replicas in (None, 1, 1000):
            raw, _ = _core.build_put(keys, prepared, replicas, checker)
            ref, _ = _core.build_put(keys, geometries, replicas, checker)
            assert raw == ref.SerializeToString()
        # a mixed batch goes through messages and merges the prepared bytes in
        mixed, _, _ = _core.build_get(keys[:3], [prepared[0], geometries[1], None], 5, checker)
        ref, _, _ = _core.build_get(keys[:3], [geometries[0], geometries[1], None], 5, checker)
        assert mixed == ref
        mixed_put, _ = _core.build_put(keys[:2], [prepared[0], b"inline"], None, checker)
        assert mixed_put.items[0].slices == ref.items[0].slices
        assert mixed_put.items[1].data == b"inline"
        # the per-use checks still run on the bytes path
        with pytest.raises(ValueError, match="lease id .* 64 bits"):
            _core.build_get(keys[:1], prepared[:1], 1 << 64, checker)
        del checker.sizes[77]
        with pytest.raises(ValueError, match="get item 2: .*no longer registered"):
            _core.build_get(keys[:3], prepared[:3], None, checker)
        with pytest.raises(ValueError, match="put item 2: .*no longer registered"):
            _core.build_put(keys[:3], prepared[:3], None, checker)
    with pytest.raises(ValueError, match="closed or re-registered"):
        _core.build_get(keys[:1], prepared[:1], None, checker)
