"""GPU buffers in the Python client (docs/gpu.md, "How an engine registers its KV cache"):
the CUDA IPC export of a torch tensor, RegisterGpuBuffer/UnregisterGpuBuffer as sent, the
client-side checks of GPU slices, and the error of a daemon without --cuda_device. No GPU is
needed: tensors are stand-ins with torch's attributes, the GpuBuffers service an in-process
gRPC server (the real one is tested in C++ on the fake device and on a GPU by
bench/gpu_check.sh)."""

import asyncio
import os
import socket
import struct
import threading
from concurrent import futures

import grpc
import pytest

from mcstore import AsyncClient, Client, Code, GpuBuffer, StoreError
from mcstore._gpu import GPU_BUFFER_ID_BIT, export_cuda_tensor
from mcstore.v1 import gpu_pb2, gpu_pb2_grpc

HANDLE = bytes(range(64))


class FakeStorage:
    def __init__(self, handle=HANDLE, storage_offset_bytes=4096, device=1):
        self.shared = (device, handle, 1 << 20, storage_offset_bytes, b"ref", 0, b"ev", False)

    def _share_cuda_(self):
        return self.shared


class FakeCudaTensor:
    """The attributes of a torch CUDA tensor that export_cuda_tensor reads."""

    is_cuda = True
    device = "cuda:1"

    def __init__(self, numel=1024, element_size=2, storage_offset=8, contiguous=True,
                 storage=None):
        self._numel, self._element, self._offset = numel, element_size, storage_offset
        self._contiguous = contiguous
        self._storage = storage or FakeStorage()

    def is_contiguous(self):
        return self._contiguous

    def element_size(self):
        return self._element

    def numel(self):
        return self._numel

    def storage_offset(self):
        return self._offset

    def untyped_storage(self):
        return self._storage


def test_export_is_the_tensors_byte_range_inside_the_allocation():
    e = export_cuda_tensor(FakeCudaTensor(numel=1024, element_size=2, storage_offset=8))
    assert e.device == 1
    assert e.handle == HANDLE
    assert e.allocation_offset == 4096 + 8 * 2  # the storage's offset + the tensor's in it
    assert e.size == 2048


def test_export_refuses_what_cannot_be_one_gpu_range():
    with pytest.raises(TypeError, match="CUDA tensor"):
        export_cuda_tensor(b"bytes")
    with pytest.raises(ValueError, match="contiguous"):
        export_cuda_tensor(FakeCudaTensor(contiguous=False))
    with pytest.raises(ValueError, match="empty"):
        export_cuda_tensor(FakeCudaTensor(numel=0))
    with pytest.raises(ValueError, match="expandable"):
        export_cuda_tensor(FakeCudaTensor(storage=FakeStorage(handle=b"short")))


def test_export_refuses_a_cpu_torch_tensor():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="CUDA tensor"):
        export_cuda_tensor(torch.zeros(4))


class FakeGpuBuffers(gpu_pb2_grpc.GpuBuffersServicer):
    def __init__(self, bit63=True):
        self.registered = []
        self.unregistered = []
        self.metadata = []
        self.bit63 = bit63
        self.lock = threading.Lock()

    def RegisterGpuBuffer(self, request, context):
        with self.lock:
            self.registered.append(request)
            self.metadata.append(dict(context.invocation_metadata()))
            n = len(self.registered)
        return gpu_pb2.RegisterGpuBufferResponse(
            buffer_id=(GPU_BUFFER_ID_BIT if self.bit63 else 0) | n, device_name="Fake GPU")

    def UnregisterGpuBuffer(self, request, context):
        with self.lock:
            self.unregistered.append(request.buffer_id)
        return gpu_pb2.UnregisterGpuBufferResponse()


@pytest.fixture
def gpu_server():
    def start(bit63=True):
        service = FakeGpuBuffers(bit63)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        gpu_pb2_grpc.add_GpuBuffersServicer_to_server(service, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return service, "127.0.0.1:%d" % port
    servers = []
    yield start
    for s in servers:
        s.stop(0)


def test_register_cuda_sends_the_export_and_close_unregisters(gpu_server):
    service, address = gpu_server()
    tensor = FakeCudaTensor(numel=4096, element_size=4, storage_offset=16)
    with Client(address, token="t" * 40) as c:
        buf = c.register_cuda(tensor, device=0)
        assert isinstance(buf, GpuBuffer)
        [req] = service.registered
        assert (req.version, req.kind, req.handle, req.device) == (
            1, gpu_pb2.GPU_HANDLE_CUDA_IPC, HANDLE, 0)
        assert (req.allocation_offset, req.size) == (4096 + 64, 16384)
        assert service.metadata[0]["authorization"] == "Bearer " + "t" * 40
        assert buf.buffer_id & GPU_BUFFER_ID_BIT and buf.size == 16384
        assert buf.device_name == "Fake GPU"
        assert buf._keep is tensor, "the tensor stays alive while registered"
        # Slices of it pass the client's checks; outside ones do not, before anything is sent.
        s = buf.slice(8192, 4096)
        assert (s.buffer_id, s.offset, s.length) == (buf.buffer_id, 8192, 4096)
        c._checker.check(s, "item 0")
        with pytest.raises(ValueError, match="outside"):
            buf.slice(8192, 8193)
        with pytest.raises(ValueError, match="outside"):
            c.get([b"k"], into=[[type(s)(buf.buffer_id, 16000, 1000)]])
        buf.close()
        buf.close()  # idempotent
        assert service.unregistered == [buf.buffer_id]
        with pytest.raises(ValueError, match="closed"):
            buf.slice()
        with pytest.raises(ValueError, match="not registered"):
            c.get([b"k"], into=[[s]])
        assert req.device_uuid == ""
        other = c.register_cuda(FakeCudaTensor(), device_uuid="GPU-1234")
        assert service.registered[-1].device == 1, "the tensor's own ordinal by default"
        assert service.registered[-1].device_uuid == "GPU-1234"
    assert service.unregistered == [buf.buffer_id, other.buffer_id], "closed with the Client"
    assert other.closed


def test_async_client_registers_through_its_control_client(gpu_server):
    service, address = gpu_server()

    async def main():
        async with AsyncClient(address) as c:
            buf = await c.register_cuda(FakeCudaTensor(), device_uuid="GPU-5")
            assert buf.buffer_id & GPU_BUFFER_ID_BIT
            c._checker.check(buf.slice(0, 16), "item 0")  # shared with the async calls
            raw = await c.register_gpu_handle(HANDLE, 4096, device=0)
            assert raw.size == 4096
            return buf, raw

    buf, raw = asyncio.run(main())
    assert [r.device_uuid for r in service.registered] == ["GPU-5", ""]
    assert sorted(service.unregistered) == sorted([buf.buffer_id, raw.buffer_id])


class FakeFdSocket:
    """The daemon's fd socket as far as REGISTER_GPU goes: HELLO -> owner, REGISTER_GPU with
    one fd -> a ticket; keeps the inode of every fd it received."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(path)
        self.sock.listen(1)
        self.inodes = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def close(self):
        self.sock.close()
        self.thread.join(5)

    def serve(self):
        conn, _ = self.sock.accept()
        with conn:
            while True:
                try:
                    msg, fds, _, _ = socket.recv_fds(conn, 64, 4)
                except OSError:
                    return
                if not msg:
                    return
                op, _size = struct.unpack("<IQ", msg[4:16])
                for fd in fds:
                    self.inodes.append(os.fstat(fd).st_ino)
                    os.close(fd)
                if op == 2:
                    conn.send(b"OK owner-1 -")
                elif op == 3 and len(fds) == 1:
                    conn.send(b"OK owner-1 12345678901234567890")
                else:
                    conn.send(b"ERR INVALID_ARGUMENT bad")


def test_register_gpu_fd_passes_the_fd_then_names_its_ticket(gpu_server, tmp_path):
    service, address = gpu_server()
    fd_socket = FakeFdSocket(str(tmp_path / "client.sock.fd"))
    handle = os.memfd_create("stands-for-a-cumem-export")
    try:
        with Client(address, fd_socket=str(tmp_path / "client.sock.fd")) as c:
            buf = c.register_gpu_fd(handle, 1 << 20, device=0, allocation_offset=4096)
            [req] = service.registered
            assert req.kind == gpu_pb2.GPU_HANDLE_POSIX_FD
            assert req.fd_ticket == 12345678901234567890
            assert (req.size, req.allocation_offset, req.handle) == (1 << 20, 4096, b"")
            assert service.metadata[0]["x-mc-owner"] == "owner-1", "the session that passed it"
            assert fd_socket.inodes == [os.fstat(handle).st_ino], "the very file, by SCM_RIGHTS"
            assert buf.size == 1 << 20
            with pytest.raises(ValueError, match="fd"):
                c.register_gpu_fd(-1, 4096)
        os.fstat(handle)  # the caller's fd stays open
    finally:
        os.close(handle)
        fd_socket.close()


def test_register_gpu_handle_checks_its_arguments(gpu_server):
    service, address = gpu_server()
    with Client(address) as c:
        with pytest.raises(ValueError, match="64 bytes"):
            c.register_gpu_handle(b"x" * 63, 4096)
        with pytest.raises(ValueError, match="size"):
            c.register_gpu_handle(HANDLE, 0)
        with pytest.raises(ValueError, match="device"):
            c.register_gpu_handle(HANDLE, 4096, device=-1)
        with pytest.raises(TypeError):
            c.register_gpu_handle(HANDLE, 4096.0)
        with pytest.raises(ValueError, match="allocation_offset"):
            c.register_gpu_handle(HANDLE, 4096, allocation_offset=1 << 64)
        with pytest.raises(ValueError, match="device_uuid"):
            c.register_gpu_handle(HANDLE, 4096, device_uuid="x" * 65)
    assert service.registered == []


def test_an_id_without_bit_63_is_refused_and_given_back(gpu_server):
    service, address = gpu_server(bit63=False)
    with Client(address) as c:
        with pytest.raises(StoreError) as e:
            c.register_gpu_handle(HANDLE, 4096)
        assert e.value.code == Code.INTERNAL
    assert service.unregistered == [1]


def test_daemon_without_gpu_buffers_says_how_to_serve_them(gpu_server):
    # A gRPC server without the GpuBuffers service answers UNIMPLEMENTED, as an mc-client
    # started without --cuda_device does.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Client("127.0.0.1:%d" % port) as c:
            with pytest.raises(StoreError) as e:
                c.register_gpu_handle(HANDLE, 4096)
            assert e.value.code == Code.INVALID_ARGUMENT
            assert "--cuda_device" in str(e.value)
    finally:
        server.stop(0)
