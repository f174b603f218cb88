"""The Store's gRPC channels: addresses, channel options, TLS or plaintext, and the unary
stubs over them (split from _core.py; used by Client and AsyncClient)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from mcstore._proto import SERVICE, store_pb2

if TYPE_CHECKING:
    from mcstore._tls import TlsConfig


def unary_stubs(channel: Any, names: Sequence[str]) -> Dict[str, Any]:
    """The Store RPCs `names` on a grpc (or grpc.aio) channel: requests go through serialize (a
    message, or bytes already written), answers are parsed as <name>Response."""
    spb = store_pb2()
    return {name: channel.unary_unary(
                SERVICE + name, request_serializer=serialize,
                response_deserializer=getattr(spb, name + "Response").FromString)
            for name in names}


def serialize(req: Any) -> bytes:
    """The request serializer of the Store stubs: a message, or a request already written as
    bytes by build_get/build_put's prepared-slices path."""
    return req if type(req) is bytes else req.SerializeToString()


def channel_target(address: str) -> str:
    if not isinstance(address, str) or not address:
        raise ValueError("address must be \"unix:/path/to.sock\" or \"host:port\", got %r"
                         % (address,))
    if address.startswith("unix:") or address.startswith("unix-abstract:"):
        return address
    if address.startswith("/"):
        return "unix:" + address
    if ":" not in address:
        raise ValueError("address %r has no port (\"host:port\" or \"unix:/path\")" % address)
    return address


def open_channel(module: Any, address: str, tls: Optional["TlsConfig"]) -> Any:
    """A channel of `module` (grpc or grpc.aio) to `address`: TLS with `tls`, plaintext
    without. Unix sockets take no TLS (their file mode guards them): ValueError."""
    target = channel_target(address)
    if tls is None:
        return module.insecure_channel(target, options=CHANNEL_OPTIONS)
    if target.startswith("unix"):
        raise ValueError("tls= applies to host:port addresses, not the Unix socket %r" % address)
    return module.secure_channel(target, tls.credentials(),
                                 options=CHANNEL_OPTIONS + tls.channel_options())


CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    # A restarted local daemon is reachable again within a second, not after gRPC's default
    # reconnect backoff (up to 120 s of calls failing fast with UNAVAILABLE).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
