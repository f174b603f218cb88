"""The docs say what the daemons' flags and metrics are and where things live; this keeps it true.

Flags: every `--flag` in the mc-master and mc-client flag tables (and the ports table) is an
ABSL_FLAG of that daemon, and every ABSL_FLAG of a daemon is in its tables; the TLS flags the
tools share (tools/store_channel_flags.cc) are exactly those docs/security.md names for them. Metrics: every
`mc_...` name the page mentions is a string in the C++ sources, and every `"mc_..."` string of
the daemons' sources (the names they register) is listed under "Metrics". Files: every path of
the repository that docs/*.md and README.md name (a file with its extension, `name.*`, or a
folder ending in /) exists. Plain text: reads the sources, builds nothing.
"""
import glob
import os
import re
import unittest

ROOT = os.environ.get("MC_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = "docs/operations.md"
DAEMONS = {"mc-master": ("master/master_main.cc", "mc-master flags"),
           "mc-client": ("client/client_main.cc", "mc-client flags")}
# The flags both daemons share, defined once in the daemon shell.
SHARED_FLAGS = "common/daemon_shell.cc"
# The TLS flags both tools (mc-admin, mc-bench) share, defined once beside tools/store_channel.h;
# docs/security.md's table of TLS settings names them in the tools' row.
TOOL_SHARED_FLAGS = "tools/store_channel_flags.cc"
TOOL_FLAGS_DOC = "docs/security.md"
TOOLS_CELL = "mc-admin, mc-bench"
# The folders of the daemons' code, whose metric names the page must list.
METRIC_SOURCES = ("common", "master", "client", "transfer", "offload")
METRICS_SECTION = "Metrics (Prometheus text at /metrics)"
# Names of the mc_ form on the page that are not metrics.
NOT_METRICS = {"mc_fuzzers"}  # the fuzz targets' ninja target

# The repository's top-level folders: a path the docs name starts with one of them.
TOPS = ("bench", "client", "common", "deploy", "docs", "master", "offload", "proto", "python",
        "tests", "tools", "transfer")
FILE_PATH = re.compile(r"(?<![\w/.-])((?:%s)/[\w/.@-]+\.(?:h|cc|py|md|sh|proto|txt|service|flags|"
                       r"yaml|yml|json|toml|cfg|\*))(?![\w*])" % "|".join(TOPS))
DIR_PATH = re.compile(r"(?<![\w/.-])((?:%s)/(?:[\w.@-]+/)*)(?![\w.*@-])" % "|".join(TOPS))
FLAG_DEF = re.compile(r"ABSL_FLAG\(\s*[^,]+,\s*([a-z0-9_]+)\s*,")
DOC_FLAG = re.compile(r"`--([a-z0-9_]+)")
METRIC = re.compile(r"\bmc_[a-z0-9_]+")
METRIC_STRING = re.compile(r'"(mc_[a-z0-9_]+)"')


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def section(doc, title):
    m = re.search(r"^## " + re.escape(title) + r"\n(.*?)(?=^## |\Z)", doc, re.M | re.S)
    if m is None:
        raise AssertionError("%s has no section '## %s'" % (DOC, title))
    return m.group(1)


def table_rows(text):
    """The cells of each table row (header and separator rows included; callers skip them)."""
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            yield [c.strip() for c in line.strip().strip("|").split("|")]


def documented_flags(doc, daemon):
    flags = set()
    for cells in table_rows(section(doc, DAEMONS[daemon][1])):
        flags |= set(DOC_FLAG.findall(cells[0]))
    for cells in table_rows(section(doc, "Processes and ports")):
        if cells[0] == daemon:
            flags |= set(DOC_FLAG.findall(cells[1]))
    return flags


def sources(folders):
    for top in folders:
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith((".cc", ".h")):
                    yield os.path.join(dirpath, name)


class DocsDriftTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.doc = read(DOC)

    def test_flag_tables_name_exactly_the_daemons_flags(self):
        for daemon, (main, _) in DAEMONS.items():
            with self.subTest(daemon=daemon):
                defined = set(FLAG_DEF.findall(read(main) + read(SHARED_FLAGS)))
                self.assertTrue(defined, "no ABSL_FLAG found in " + main)
                documented = documented_flags(self.doc, daemon)
                self.assertEqual(sorted(documented - defined), [],
                                 "%s documents flags %s does not define" % (DOC, main))
                self.assertEqual(sorted(defined - documented), [],
                                 "flags of %s missing from %s's tables" % (main, DOC))

    def test_tools_tls_flags_are_those_the_security_page_names(self):
        defined = set(FLAG_DEF.findall(read(TOOL_SHARED_FLAGS)))
        self.assertTrue(defined, "no ABSL_FLAG found in " + TOOL_SHARED_FLAGS)
        documented = set()
        for cells in table_rows(read(TOOL_FLAGS_DOC)):
            if len(cells) > 1 and cells[1] == TOOLS_CELL:
                documented |= set(DOC_FLAG.findall(cells[0]))
        self.assertEqual(sorted(documented - defined), [],
                         "%s documents tool flags %s does not define" % (TOOL_FLAGS_DOC,
                                                                         TOOL_SHARED_FLAGS))
        self.assertEqual(sorted(defined - documented), [],
                         "flags of %s missing from %s's '%s' row" % (TOOL_SHARED_FLAGS,
                                                                      TOOL_FLAGS_DOC, TOOLS_CELL))

    def test_every_metric_the_page_names_is_exported(self):
        exported = set()
        for path in sources(METRIC_SOURCES):
            with open(path, encoding="utf-8") as f:
                exported |= set(METRIC_STRING.findall(f.read()))
        named = set(METRIC.findall(self.doc)) - NOT_METRICS
        self.assertEqual(sorted(named - exported), [],
                         "%s names metrics no daemon exports" % DOC)

    def test_every_exported_metric_is_listed(self):
        exported = set()
        for path in sources(METRIC_SOURCES):
            with open(path, encoding="utf-8") as f:
                exported |= set(METRIC_STRING.findall(f.read()))
        self.assertGreater(len(exported), 50, "the metric names were not found")
        listed = set(METRIC.findall(section(self.doc, METRICS_SECTION)))
        self.assertEqual(sorted(exported - listed), [],
                         "metrics missing from %s's '%s'" % (DOC, METRICS_SECTION))

    def test_every_path_the_docs_name_exists(self):
        missing = []
        docs = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [
            os.path.join(ROOT, "README.md")]
        self.assertGreater(len(docs), 5)
        for doc in docs:
            with open(doc, encoding="utf-8") as f:
                text = f.read()
            rel = os.path.relpath(doc, ROOT)
            for path in FILE_PATH.findall(text):
                full = os.path.join(ROOT, path)
                if not (glob.glob(full) if path.endswith("*") else os.path.exists(full)):
                    missing.append("%s: %s" % (rel, path))
            for path in DIR_PATH.findall(text):
                if not os.path.isdir(os.path.join(ROOT, path)):
                    missing.append("%s: %s" % (rel, path))
        self.assertEqual(missing, [], "paths the docs name that do not exist")


if __name__ == "__main__":
    unittest.main()
