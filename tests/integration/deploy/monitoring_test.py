"""Every metric the Prometheus rules and the Grafana dashboard name is one the daemons export.

Starts a real cluster (mc-master, two mc-clients with SSD tiers), puts and gets through the Store
service (hits and misses) so that per-RPC series exist, scrapes both daemons' /metrics and checks
every expression of deploy/monitoring/mcstore.rules.yml and grafana-dashboard.json: each metric
name in it is exported by mc-master or mc-client (histograms by their _bucket/_sum/_count
series), or recorded by the rules (mcstore:*), and each `label="value"` it selects on exists in
a live series of that metric.
"""

import json
import os
import re
import unittest

import yaml

from integration.client import client_cluster as cc
from integration.deploy import deploy_files

MiB = 1 << 20

# PromQL words that are not metric names (aggregations may take `by (...)` before their
# parenthesis, so they are not always followed by one).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan", "sum", "min", "max", "avg", "group",
            "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile"}


def series_names(text):
    """{metric name: [label dicts]} of a /metrics page."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s", line)
        if not m:
            continue
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out.setdefault(m.group(1), []).append(labels)
    return out


def metric_references(expr):
    """[(metric name, {label: value} of its equality matchers)] in a PromQL expression."""
    # Strings and durations first, then grouping label lists, so that neither looks like a name.
    refs = []
    pos = 0
    token = re.compile(r'"(?:[^"\\]|\\.)*"|\[[^\]]*\]|\b(?:by|without|on|ignoring|group_left|'
                       r'group_right)\s*\([^)]*\)|([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\{[^}]*\})?'
                       r'(\s*\()?|[0-9.]+[a-z]*')
    while pos < len(expr):
        m = token.match(expr, pos)
        if not m:
            pos += 1
            continue
        pos = m.end()
        name, selector, call = m.group(1), m.group(2), m.group(3)
        if not name or call or name in KEYWORDS:
            continue  # a string, duration, grouping, number, function call or keyword
        matchers = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"]*)"', selector or ""))
        refs.append((name, matchers))
    return refs


class MonitoringNamesTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(clients=2, segment_size=16 * MiB,
                                 per_client_args={i: [] for i in range(2)})
        cls.ssd = []
        for i in range(2):
            d = os.path.join(cls.cluster.tmp, "ssd%d" % i)
            os.mkdir(d)
            cls.cluster.per_client_args[i] = ["--offload_dir", d, "--offload_capacity",
                                              str(64 * MiB), "--offload_direct_io=false"]
        cls.cluster.start()
        try:
            stub = cls.cluster.stub(0)
            cc.put_inline(stub, [(b"deploy-k%d" % i, b"x" * 4096) for i in range(4)])
            cc.get_inline(cls.cluster.stub(1), [b"deploy-k0", b"deploy-missing"])
            cls.exported = {"mc-master": series_names(
                cc.harness.http_get(cls.cluster.master_http(), "/metrics")[1])}
            # Both clients: one served the puts, the other the gets.
            clients = cls.exported["mc-client"] = {}
            for i in range(2):
                for name, series in series_names(
                        cc.harness.http_get(cls.cluster.http(i), "/metrics")[1]).items():
                    clients.setdefault(name, []).extend(series)
        except Exception:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def rules(self):
        return yaml.safe_load(deploy_files.read("monitoring", "mcstore.rules.yml"))

    def recorded(self):
        return {r["record"] for g in self.rules()["groups"] for r in g["rules"] if "record" in r}

    def check(self, where, expr):
        """The problems of one expression: names nobody exports, selectors no series matches."""
        problems, checked = [], 0
        for name, matchers in metric_references(expr):
            checked += 1
            if name in self.recorded():
                continue
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            owners = [d for d, names in self.exported.items() if name in names or
                      (base != name and base + "_bucket" in names)]
            if not owners:
                problems.append("%s: %s is exported by neither daemon" % (where, name))
                continue
            for d in owners:
                live = self.exported[d].get(name, [])
                if any(all(s.get(k) == v for k, v in matchers.items()) for s in live):
                    break
            else:
                problems.append("%s: no live %s series has %s" % (where, name, matchers))
        return problems, checked

    def test_the_parser_finds_names_not_functions_labels_or_durations(self):
        self.assertEqual(
            metric_references('sum without (instance, pod) (rate(mc_a_total{rpc="Get",'
                              'code!="OK"}[5m])) / on() group_left max by (le) (mcstore:b:r) '
                              '> 0.5 or absent(mc_c)'),
            [("mc_a_total", {"rpc": "Get"}), ("mcstore:b:r", {}), ("mc_c", {})])

    def test_every_rule_expression_names_exported_metrics(self):
        problems, checked = [], 0
        for group in self.rules()["groups"]:
            for rule in group["rules"]:
                p, n = self.check(rule.get("record") or rule.get("alert"), rule["expr"])
                problems += p
                checked += n
        self.assertEqual(problems, [])
        self.assertGreater(checked, 20)

    def test_every_dashboard_expression_names_exported_metrics(self):
        dash = json.loads(deploy_files.read("monitoring", "grafana-dashboard.json"))
        problems, checked = [], 0

        def walk(panels):
            nonlocal problems, checked
            for panel in panels:
                walk(panel.get("panels", []))
                for target in panel.get("targets", []):
                    p, n = self.check(panel["title"], target["expr"])
                    problems += p
                    checked += n
        walk(dash["panels"])
        self.assertEqual(problems, [])
        self.assertGreater(checked, 30)

    def test_a_metric_nobody_exports_is_caught(self):
        problems, _ = self.check("probe", 'rate(mc_no_such_metric_total[5m]) + '
                                          'mc_client_items_total{rpc="NoSuchRpc"}')
        self.assertEqual(len(problems), 2, problems)


if __name__ == "__main__":
    unittest.main()
