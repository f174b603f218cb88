"""AsyncClient: the Client's API as coroutines over grpc.aio, for asyncio code that overlaps
loads and saves with compute."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc
import grpc.aio

from mcstore import _answers, _channel, _core
from mcstore._buffers import SharedBuffer, Slice
from mcstore._client import Client, _LeaseFields
from mcstore._tls import TlsArg, tls_config
from mcstore._core import IntoArg, KeyLike, ValuesArg
from mcstore._errors import Code, GetResult, Result, StoreError
from mcstore._gpu import GpuBuffer
from mcstore._proto import store_pb2


class AsyncLease(_LeaseFields):
    """The Lease of AsyncClient.match_prefix: `matched`, `lease_id`, `expiry_ms`, `keys`,
    `token` and `ref` (see Lease); `await release()`; `async with` releases on exit."""

    def __init__(self, client: "AsyncClient", matched: int, lease_id: int, expiry_ms: int,
                 keys: List[bytes], token: bytes = b"") -> None:
        super().__init__(matched, lease_id, expiry_ms, keys, token)
        self._client = client

    async def release(self) -> None:
        if self._claim_release():
            await self._client.release_lease(self.ref)

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            await self.release()
        except StoreError:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        return self._repr("AsyncLease")


class AsyncClient:
    """Client's API as coroutines (grpc.aio). Create it inside the running event loop that
    uses it. Many calls may be in flight at once (asyncio.gather). Every call goes over gRPC:
    the daemon's fast channel is Client's (synchronous calls) only.

    Buffers: `await create_buffer(n)` returns a SharedBuffer registered through a small
    synchronous control channel, so SharedBuffer.close() works from any thread."""

    def __init__(self, address: str, timeout_s: float = 10.0, *, token: Optional[str] = None,
                 token_file: Optional[str] = None, fd_socket: Optional[str] = None,
                 tls: TlsArg = None) -> None:
        self.address = address
        self.timeout_s = float(timeout_s)
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self._channel = _channel.open_channel(grpc.aio, address, tls_config(tls))
        self._rpc: Dict[str, Any] = _channel.unary_stubs(self._channel, (
            "BatchPut", "BatchGet", "BatchExist", "MatchPrefix", "ReleaseLease", "BatchRemove"))
        # buffers and their fd session; no connection until used
        self._control = Client(address, timeout_s, token=token, token_file=token_file,
                               fd_socket=fd_socket, tls=tls)
        self._checker = self._control._checker
        self._packed_match = True
        self.closed = False

    async def _call(self, rpc: str, req: Any, timeout_s: Optional[float]) -> Any:
        if self.closed:
            raise ValueError("the mcstore AsyncClient for %s is closed" % self.address)
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        try:
            return await self._rpc[rpc](req, timeout=timeout,
                                        metadata=self._control._metadata())
        except grpc.RpcError as e:
            raise self._control._error(e, rpc) from None

    async def put(self, keys: Sequence[KeyLike], values: ValuesArg,
                  replicas: Optional[int] = None, *,
                  timeout_s: Optional[float] = None) -> List[Result]:
        """See Client.put."""
        req, bkeys = _core.build_put(keys, values, replicas, self._checker)
        return _answers.parse_results(await self._call("BatchPut", req, timeout_s), bkeys,
                                   "BatchPut", self.address)

    async def get(self, keys: Sequence[KeyLike], into: IntoArg = None,
                  lease: Any = None, *, timeout_s: Optional[float] = None) -> List[GetResult]:
        """See Client.get."""
        req, bkeys, lengths = _core.build_get(keys, into, lease, self._checker)
        return _answers.parse_get(await self._call("BatchGet", req, timeout_s), bkeys, lengths,
                               self.address)

    async def exist(self, keys: Sequence[KeyLike], *,
                    timeout_s: Optional[float] = None) -> List[bool]:
        """See Client.exist."""
        bkeys = _core.encode_keys(keys)
        resp = await self._call("BatchExist", store_pb2().BatchExistRequest(keys=bkeys),
                                timeout_s)
        return _answers.parse_exist(resp, bkeys, self.address)

    async def remove(self, keys: Sequence[KeyLike], *,
                     timeout_s: Optional[float] = None) -> List[Result]:
        """See Client.remove."""
        bkeys = _core.encode_keys(keys)
        resp = await self._call("BatchRemove", store_pb2().BatchRemoveRequest(keys=bkeys),
                                timeout_s)
        return _answers.parse_results(resp, bkeys, "BatchRemove", self.address)

    async def match_prefix(self, keys: Sequence[KeyLike], lease_ttl_ms: int = 0, *,
                           timeout_s: Optional[float] = None) -> AsyncLease:
        """See Client.match_prefix."""
        packed = self._packed_match
        req, bkeys = _core.build_match(keys, lease_ttl_ms, packed)
        resp = await self._call("MatchPrefix", req, timeout_s)
        if packed and _answers.needs_unpacked_retry(resp, bkeys):
            self._packed_match = False
            req, bkeys = _core.build_match(keys, lease_ttl_ms, False)
            resp = await self._call("MatchPrefix", req, timeout_s)
        matched, lease_id, expiry, token = _answers.parse_match(resp, bkeys, lease_ttl_ms,
                                                             self.address)
        return AsyncLease(self, matched, lease_id, expiry, bkeys[:matched], token)

    async def release_lease(self, lease: Any, *, timeout_s: Optional[float] = None) -> bool:
        """See Client.release_lease."""
        lease_id, token = _core.lease_of(lease)
        req = store_pb2().ReleaseLeaseRequest(lease_id=lease_id, lease_token=token)
        try:
            await self._call("ReleaseLease", req, timeout_s)
        except StoreError as e:
            if e.code == Code.NOT_FOUND:
                return False
            raise
        return True

    def prepare_slices(self, slices: Any) -> "_core.PreparedSlices":
        """Client.prepare_slices (no RPC)."""
        return _core.PreparedSlices(slices, self._checker)

    def block_layout(self, runs: Sequence[Tuple[Slice, int]]) -> "_core.BlockLayout":
        """Client.block_layout (no RPC)."""
        return _core.BlockLayout(runs, self._checker)

    async def create_buffer(self, nbytes: int) -> SharedBuffer:
        """See Client.create_buffer (registration runs in a worker thread)."""
        return await asyncio.get_running_loop().run_in_executor(
            None, self._control.create_buffer, nbytes)

    async def register_buffer(self, shm_name: str, size: int) -> int:
        """See Client.register_buffer."""
        return await asyncio.get_running_loop().run_in_executor(
            None, self._control.register_buffer, shm_name, size)

    async def register_cuda(self, tensor: Any, *, device: Optional[int] = None,
                            device_uuid: Optional[str] = None) -> GpuBuffer:
        """See Client.register_cuda (registration runs in a worker thread; the GpuBuffer is
        closed with this client)."""
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self._control.register_cuda, tensor, device=device,
                                    device_uuid=device_uuid))

    async def register_gpu_handle(self, handle: bytes, size: int, *, device: int = 0,
                                  allocation_offset: int = 0, device_uuid: Optional[str] = None,
                                  keep: Any = None) -> GpuBuffer:
        """See Client.register_gpu_handle."""
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self._control.register_gpu_handle, handle, size,
                                    device=device, allocation_offset=allocation_offset,
                                    device_uuid=device_uuid, keep=keep))

    async def register_gpu_fd(self, fd: int, size: int, *, device: int = 0,
                              allocation_offset: int = 0, device_uuid: Optional[str] = None,
                              keep: Any = None) -> GpuBuffer:
        """See Client.register_gpu_fd."""
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self._control.register_gpu_fd, fd, size, device=device,
                                    allocation_offset=allocation_offset,
                                    device_uuid=device_uuid, keep=keep))

    async def close(self) -> None:
        """Closes the buffers and both channels. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._control.close()
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return "AsyncClient(%r%s)" % (self.address, ", closed" if self.closed else "")
