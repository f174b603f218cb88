"""Helpers of the deployment tests: the repository's deploy/ files and the daemons' own flags.

daemon_flags(binary) lists the flags a daemon defines itself (its --helpfull sections outside
Abseil); flagfile_flags(text) the flags a flag file names, active or commented out. Standard
library plus PyYAML (Debian's python3-yaml).
"""

import os
import re
import subprocess

import yaml

SOURCE = os.environ.get("MC_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DEPLOY = os.path.join(SOURCE, "deploy")


def path(*parts):
    return os.path.join(DEPLOY, *parts)


def read(*parts):
    with open(path(*parts)) as f:
        return f.read()


def daemon_flags(binary):
    """The flags `binary` defines itself: the --helpfull sections of files outside absl/."""
    out = subprocess.run([binary, "--helpfull"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=30).stdout.decode()
    flags, ours = set(), False
    for line in out.splitlines():
        m = re.match(r"\s*Flags from (\S+):", line)
        if m:
            ours = "absl/" not in m.group(1)
            continue
        m = re.match(r"\s+--([a-z0-9_]+) \(", line)
        if m and ours:
            flags.add(m.group(1))
    if not flags:
        raise AssertionError("no flags found in %s --helpfull:\n%s" % (binary, out[:2000]))
    return flags


def flagfile_flags(text, commented=True):
    """Flags named by a flag file: `--name=value` lines, and `# --name=...` lines if commented."""
    pattern = r"^(?:#\s*)?--([a-z0-9_]+)=" if commented else r"^--([a-z0-9_]+)="
    return set(re.findall(pattern, text, flags=re.M))


def argv_flags(args):
    """Flag names in a list of arguments (`--name=value` or `--name value`)."""
    return {m.group(1) for a in args for m in [re.match(r"--([a-z0-9_]+)", a)] if m}


def k8s_documents(name):
    with open(path("k8s", name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def k8s_containers(name, kind):
    """(container name, command + args) of every container of the `kind` objects in a file."""
    out = []
    for doc in k8s_documents(name):
        if doc.get("kind") != kind:
            continue
        spec = doc["spec"]["template"]["spec"]
        for c in spec.get("containers", []):
            out.append((c["name"], list(c.get("command", [])) + list(c.get("args", []))))
    return out


def exec_start(unit_text):
    """The words of a unit's ExecStart= line."""
    m = re.search(r"^ExecStart=(.*)$", unit_text, flags=re.M)
    if not m:
        raise AssertionError("no ExecStart=")
    return m.group(1).split()
