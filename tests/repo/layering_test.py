"""The include graph follows the layers of DESIGN.md and client/README.md.

Folders: common <- proto <- transfer, offload <- client; master on common and proto only;
production code never includes tests/. Inside transfer/, a transport's folder includes no other
transport's, and nothing outside transfer/ includes a transport's implementation. Inside
client/, the rooms include only rooms below them (client/README.md's order); client_metrics.h at
the root is a leaf any room may include.
"""
import os
import re
import subprocess
import unittest

ROOT = os.environ.get("MC_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))

# Which top-level folders each production folder may include (besides itself and third-party).
ALLOWED = {
    "common": set(),
    "proto": {"common", "mcstore"},
    "transfer": {"common", "proto", "mcstore"},
    "offload": {"common", "proto", "mcstore", "transfer"},
    "master": {"common", "proto", "mcstore"},
    "client": {"common", "proto", "mcstore", "transfer", "offload"},
    "tools": {"common", "proto", "mcstore", "client", "transfer"},
}
OURS = {"common", "proto", "transfer", "offload", "master", "client", "tools", "tests", "bench"}
CLIENT_ROOMS = ["access", "gpu", "buffers", "session", "tier", "batch", "fast", "store"]
CLIENT_LEAVES = {"client/client_metrics.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# A transport's implementation: its transport class, or anything of rdma/ and local/.
TRANSPORT_HEADER = re.compile(r"^transfer/(\w+/\w+_transport\.h|rdma/|local/)")


def sources(folder):
    out = subprocess.check_output(["git", "ls-files", folder], cwd=ROOT, text=True)
    return [p for p in out.split() if p.endswith((".h", ".cc", ".cu"))]


def includes(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return INCLUDE.findall(f.read())


class Layering(unittest.TestCase):
    def test_folders_include_only_the_layers_below(self):
        bad = []
        for folder, allowed in ALLOWED.items():
            for path in sources(folder):
                for inc in includes(path):
                    top = inc.split("/", 1)[0]
                    if "/" in inc and top in OURS | {"mcstore"} and top != folder \
                            and top not in allowed:
                        bad.append("%s includes %s" % (path, inc))
        self.assertEqual(bad, [], "includes against the layering:\n" + "\n".join(bad))

    def test_transports_do_not_include_each_other(self):
        # transfer/<transport>/ (local, tcp, rdma, cuda, ...) includes transfer/'s root headers
        # and its own folder only: what one transport needs of another goes through an interface
        # at the root (remote_dma.h, peer_exchange.h), wired by the registry. A new transport
        # then plugs in without touching the others.
        bad = []
        for path in sources("transfer"):
            parts = path.split("/")
            if len(parts) < 3:
                continue  # the root: the engine and the registry know every transport
            for inc in includes(path):
                ip = inc.split("/")
                if len(ip) >= 3 and ip[0] == "transfer" and ip[1] != parts[1]:
                    bad.append("%s (transport %s) includes %s" % (path, parts[1], inc))
        self.assertEqual(bad, [], "transports including each other:\n" + "\n".join(bad))

    def test_nothing_outside_transfer_reaches_a_transport(self):
        # The engine hands out capabilities (transfer/gpu_transfers.h, MemoryRegistrar, its
        # data-plane ops), never a transport: outside transfer/ (tests and benchmarks aside) no
        # file includes a transport's implementation header. The device seam and mover
        # (transfer/cuda/cuda_api.h, gpu_mover.h) and the tcp data server and frame are not
        # transports.
        bad = []
        for folder in ALLOWED:
            if folder == "transfer":
                continue
            for path in sources(folder):
                for inc in includes(path):
                    if TRANSPORT_HEADER.match(inc):
                        bad.append("%s includes %s" % (path, inc))
        self.assertEqual(bad, [], "transports reached from outside transfer/:\n" + "\n".join(bad))

    def test_client_rooms_include_only_rooms_below(self):
        rank = {room: i for i, room in enumerate(CLIENT_ROOMS)}
        bad = []
        for path in sources("client"):
            parts = path.split("/")
            if len(parts) == 2:
                continue  # the root wires every room
            mine = rank.get(parts[1])
            self.assertIsNotNone(mine, "%s is in no room of client/README.md" % path)
            for inc in includes(path):
                if not inc.startswith("client/") or inc in CLIENT_LEAVES:
                    continue
                ip = inc.split("/")
                if len(ip) == 2:
                    bad.append("%s includes the daemon's root header %s" % (path, inc))
                elif ip[1] != parts[1] and rank.get(ip[1], len(rank)) >= mine:
                    bad.append("%s (room %s) includes %s (room %s, not below)"
                               % (path, parts[1], inc, ip[1]))
        self.assertEqual(bad, [], "\n".join(bad))


if __name__ == "__main__":
    unittest.main()
