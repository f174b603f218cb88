"""TLS towards a daemon's TCP Store listener (mc-client --listen with --tls_cert_file)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import grpc


@dataclass(frozen=True)
class TlsConfig:
    """How a Client verifies the daemon and, optionally, proves itself to it (PEM files).

        Client("store1.example:50052", token_file="store.token",
               tls=TlsConfig(ca_file="ca.pem"))

    `ca_file`: the CA bundle the daemon's certificate must chain to; the certificate must name
    the host of the address dialled (or `server_name`) in its subjectAltName. `cert_file` and
    `key_file` (both or neither): a client certificate, for a daemon run with
    --tls_client_ca_file. The key file must be private to its owner (mode 0600), as the
    daemons require. Files are read when the Client is made."""
    ca_file: str
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    server_name: Optional[str] = None

    def __post_init__(self) -> None:
        if not self.ca_file:
            raise ValueError("TlsConfig needs ca_file")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("TlsConfig: cert_file and key_file go together")

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials made from the files."""
        with open(self.ca_file, "rb") as f:
            roots = f.read()
        chain = key = None
        if self.cert_file and self.key_file:
            with open(self.cert_file, "rb") as f:
                chain = f.read()
            key = _read_private(self.key_file)
        return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key,
                                            certificate_chain=chain)

    def channel_options(self) -> List[Tuple[str, str]]:
        """The channel options the server-name override needs (none without one)."""
        if not self.server_name:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]


TlsArg = Union[TlsConfig, str, None]


def tls_config(tls: TlsArg) -> Optional[TlsConfig]:
    """`tls=` as Client takes it: a TlsConfig, a CA file path (shorthand for
    TlsConfig(ca_file=path)), or None (plaintext)."""
    if tls is None or isinstance(tls, TlsConfig):
        return tls
    if isinstance(tls, str):
        return TlsConfig(ca_file=tls)
    raise TypeError("tls must be a TlsConfig, a CA file path or None, got %r" % (tls,))


def _read_private(path: str) -> bytes:
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError("key file %s is not a regular file" % path)
        if st.st_mode & 0o077:
            raise PermissionError("key file %s may be read by group or others (mode %o): "
                                  "chmod 600 %s" % (path, st.st_mode & 0o777, path))
        return f.read()
