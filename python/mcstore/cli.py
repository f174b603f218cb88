"""`mcstore` (the console script) or `python -m mcstore`: a small command line over the Store
service of one mc-client daemon.

    python -m mcstore -a unix:/run/mcstore/client.sock status [--admin 127.0.0.1:9101]
    python -m mcstore -a HOST:PORT put KEY [VALUE | -f FILE | -]     (- reads stdin)
    python -m mcstore -a HOST:PORT get KEY [-o FILE]                  (default: stdout)
    python -m mcstore -a HOST:PORT exist KEY...
    python -m mcstore -a HOST:PORT ls KEY...
    python -m mcstore -a HOST:PORT rm KEY...

The address defaults to $MCSTORE_ADDRESS. Keys are UTF-8 text, or hex with --hex. Exit status:
0 success, 1 a key failed (missing, error), 2 usage or connection error.

There is no listing RPC in the Store service (keys are opaque, usually hashes, and live on the
master), so `ls` cannot enumerate a namespace: it prints, for the keys given, which exist.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from typing import List, Optional, Sequence

from mcstore._client import Client
from mcstore._version import __version__
from mcstore._errors import StoreError, UnavailableError


def _keys(args: argparse.Namespace, raw: Sequence[str]) -> List[bytes]:
    if args.hex:
        try:
            return [bytes.fromhex(k) for k in raw]
        except ValueError as e:
            raise SystemExit("mcstore: bad hex key: %s" % e)
    return [k.encode("utf-8") for k in raw]


def _show(key: bytes, args: argparse.Namespace) -> str:
    return key.hex() if args.hex else key.decode("utf-8", "backslashreplace")


def _http_get(address: str, path: str, timeout_s: float) -> str:
    url = "http://%s%s" % (address, path)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        raise UnavailableError("GET %s: %s" % (url, e), address=address) from None


def cmd_status(c: Optional[Client], args: argparse.Namespace) -> int:
    rc = 0
    if args.admin:
        sys.stdout.write(_http_get(args.admin, "/status", args.timeout))
    if c is not None:
        # BatchExist of no keys goes through the daemon to the master: both must answer.
        c.exist([])
        print("store %s: reachable (daemon and master answered)" % c.address)
    return rc


def cmd_put(c: Client, args: argparse.Namespace) -> int:
    if args.file is not None:
        with open(args.file, "rb") as f:
            data = f.read()
    elif args.value is None or args.value == "-":
        data = sys.stdin.buffer.read()
    else:
        data = args.value.encode("utf-8")
    [r] = c.put(_keys(args, [args.key]), [data], replicas=args.replicas)
    if not r.ok:
        print("mcstore: put %s: %s: %s" % (args.key, r.code.name, r.message), file=sys.stderr)
        return 1
    return 0


def cmd_get(c: Client, args: argparse.Namespace) -> int:
    [r] = c.get(_keys(args, [args.key]))
    if not r.ok:
        print("mcstore: get %s: %s: %s" % (args.key, r.code.name, r.message), file=sys.stderr)
        return 1
    assert r.data is not None
    if args.output and args.output != "-":
        with open(args.output, "wb") as f:
            f.write(r.data)
    else:
        sys.stdout.buffer.write(r.data)
        sys.stdout.flush()
    return 0


def cmd_exist(c: Client, args: argparse.Namespace) -> int:
    if not args.keys:
        print("mcstore: ls/exist need keys: the Store service has no listing RPC (keys are "
              "opaque hashes kept by the master), so a namespace cannot be enumerated",
              file=sys.stderr)
        return 2
    keys = _keys(args, args.keys)
    found = c.exist(keys)
    for k, f in zip(keys, found):
        print("%s\t%s" % ("present" if f else "absent", _show(k, args)))
    return 0 if all(found) else 1


def cmd_rm(c: Client, args: argparse.Namespace) -> int:
    keys = _keys(args, args.keys)
    rc = 0
    for r in c.remove(keys):
        assert r.key is not None
        if r.ok:
            print("removed\t%s" % _show(r.key, args))
        else:
            print("mcstore: rm %s: %s: %s" % (_show(r.key, args), r.code.name, r.message),
                  file=sys.stderr)
            rc = 1
    return rc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mcstore",
                                description="mcstore command line (Store service of an "
                                            "mc-client daemon)")
    p.add_argument("--version", action="version", version="mcstore " + __version__)
    p.add_argument("-a", "--address", default=os.environ.get("MCSTORE_ADDRESS"),
                   help="daemon address: unix:/path or host:port (default $MCSTORE_ADDRESS)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call (10)")
    p.add_argument("--token-file", default=None,
                   help="file holding the daemon's Store token, needed over TCP "
                        "(default: $MCSTORE_TOKEN_FILE)")
    p.add_argument("--hex", action="store_true", help="keys are given and shown as hex")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("status", help="check the daemon (and its master) answer")
    s.add_argument("--admin", help="also print GET /status of the daemon's --http HOST:PORT")
    s.set_defaults(fn=cmd_status)
    s = sub.add_parser("put", help="store one key")
    s.add_argument("key")
    s.add_argument("value", nargs="?", help="UTF-8 text; '-' or absent: stdin")
    s.add_argument("-f", "--file", help="read the value from FILE")
    s.add_argument("--replicas", type=int, default=None)
    s.set_defaults(fn=cmd_put)
    s = sub.add_parser("get", help="read one key")
    s.add_argument("key")
    s.add_argument("-o", "--output", help="write to FILE (default stdout)")
    s.set_defaults(fn=cmd_get)
    for name in ("exist", "ls"):
        s = sub.add_parser(name, help="which of the given keys exist (no listing RPC exists)")
        s.add_argument("keys", nargs="*")
        s.set_defaults(fn=cmd_exist)
    s = sub.add_parser("rm", help="remove keys")
    s.add_argument("keys", nargs="+")
    s.set_defaults(fn=cmd_rm)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.address and not (args.cmd == "status" and args.admin):
        print("mcstore: no daemon address: give -a unix:/path or -a host:port, or set "
              "MCSTORE_ADDRESS", file=sys.stderr)
        return 2
    try:
        client = (Client(args.address, timeout_s=args.timeout, token_file=args.token_file)
                  if args.address else None)
        try:
            return args.fn(client, args)
        finally:
            if client is not None:
                client.close()
    except (UnavailableError, ValueError, OSError) as e:
        print("mcstore: %s" % e, file=sys.stderr)
        return 2
    except StoreError as e:
        print("mcstore: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
