"""The package as a user gets it from a checkout: `python -m build` (sdist, then the wheel built
from that sdist, in an isolated build environment from PyPI) on a copy of python/ and proto/, the
wheel installed into a fresh venv with nothing else, then put/get through its `mcstore` console
script and its Python API against a local cluster. Needs PyPI (build isolation and the wheel's
dependencies; pip's cache makes reruns quick). ctest `py_wheel`, label `wheel`: deploy/test.sh
runs it once, in the release stage."""

import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

SOURCE_DIR = os.environ.get("MC_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
PIP_TIMEOUT_S = 600


def run(cmd, **kw):
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, **kw)
    assert r.returncode == 0, "%s failed:\n%s%s" % (" ".join(map(str, cmd)), r.stdout, r.stderr)
    print("wheel test: %.1f s: %s" % (time.monotonic() - t0, " ".join(
        [os.path.basename(str(cmd[0]))] + [str(c)[:40] for c in cmd[1:4]])))
    return r.stdout


def clean_env():
    """No PYTHONPATH or venv of ours leaks into the fresh interpreters."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def test_wheel_from_python_build_works_in_a_clean_venv(cluster, tmp_path):
    env = clean_env()
    src = tmp_path / "src"
    shutil.copytree(os.path.join(SOURCE_DIR, "python"), src / "python",
                    ignore=shutil.ignore_patterns("__pycache__", "build", "dist", "*.egg-info",
                                                  "v1"))
    shutil.copytree(os.path.join(SOURCE_DIR, "proto"), src / "proto")

    builder = tmp_path / "builder"
    run(["/usr/bin/python3", "-m", "venv", str(builder)], env=env)
    run([str(builder / "bin" / "pip"), "install", "-q", "build"], env=env)
    dist = tmp_path / "dist"
    run([str(builder / "bin" / "python"), "-m", "build", "--outdir", str(dist),
         str(src / "python")], env=env)
    [sdist] = list(dist.glob("mcstore-*.tar.gz"))
    [wheel] = list(dist.glob("mcstore-*-py3-none-any.whl"))
    with tarfile.open(sdist) as t:
        names = t.getnames()
    assert any(n.endswith("/proto/mcstore/v1/store.proto") for n in names), names
    names = zipfile.ZipFile(wheel).namelist()
    for f in ("mcstore/v1/store_pb2.py", "mcstore/v1/store_pb2_grpc.py", "mcstore/py.typed",
              "mcstore/_wire.py", "mcstore/sglang/__init__.py", "mcstore/vllm/blocks.py"):
        assert f in names, f

    fresh = tmp_path / "fresh"
    run(["/usr/bin/python3", "-m", "venv", str(fresh)], env=env)
    run([str(fresh / "bin" / "pip"), "install", "-q", str(wheel)], env=env)
    installed = {line.split("==")[0].lower() for line in
                 run([str(fresh / "bin" / "pip"), "freeze"], env=env).split()}
    assert "mcstore" in installed and not ({"grpcio-tools", "torch"} & installed), installed

    addr = "unix:" + cluster.clients[0].ready["unix_socket"]
    other = "unix:" + cluster.clients[1].ready["unix_socket"]
    key = "wheel-%d" % os.getpid()
    cli = str(fresh / "bin" / "mcstore")
    assert run([cli, "--version"], env=env).strip() == "mcstore " + run(
        [str(fresh / "bin" / "python"), "-c", "import mcstore; print(mcstore.__version__)"],
        env=env).strip()
    run([cli, "-a", addr, "put", key, "hello from a wheel"], env=env)
    assert run([cli, "-a", other, "get", key], env=env) == "hello from a wheel"
    script = ("import mcstore, numpy, os, sys\n"
              "assert os.path.exists(os.path.join(os.path.dirname(mcstore.__file__), 'py.typed'))\n"
              "with mcstore.Client(sys.argv[1]) as c:\n"
              "    buf = c.create_buffer(1 << 20)\n"
              "    a = buf.numpy('uint8', (1 << 20,)); a[:] = numpy.arange(1 << 20) % 251\n"
              "    mcstore.raise_for_results(c.put([sys.argv[3]], [[buf.slice()]]))\n"
              "with mcstore.Client(sys.argv[2]) as c:\n"
              "    [r] = c.get([sys.argv[3]])\n"
              "    assert r.ok and r.data == bytes(a), r\n"
              "print('ok', mcstore.__file__)\n")
    out = run([str(fresh / "bin" / "python"), "-c", script, addr, other, key + "-zc"],
              env=env, cwd=str(tmp_path))
    assert out.startswith("ok " + str(fresh))
