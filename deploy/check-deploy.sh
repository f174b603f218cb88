#!/usr/bin/env bash
# Checks the deployment files offline, each step timed:
#   systemd   deploy/systemd/*: `systemd-analyze verify` (no warning allowed; the units' binaries
#             point into the build) and `systemd-analyze security --offline` (exposure <= 2.5);
#   k8s       deploy/k8s/*.yaml against the Kubernetes schemas, strict (kubernetes-validate from
#             the project venv; versions $MC_K8S_VERSIONS, default "1.30.0 1.37.0");
#   rules     deploy/monitoring/mcstore.rules.yml: `promtool check rules`, and its unit tests
#             `promtool test rules mcstore.rules.test.yml`;
#   dashboard deploy/monitoring/grafana-dashboard.json: valid JSON, every panel expression parsed
#             by promtool (as a recording rule).
# That every metric the rules and the dashboard name is exported by the daemons is checked
# against live daemons by tests/integration/deploy/monitoring_test.py.
#   deploy/check-deploy.sh [build-dir]   (default build/; needs mc-master and mc-client there)
# Exit 0: all passed; 77: passed but the k8s step was skipped for want of the venv (an error
# instead when MC_REQUIRE_VENV is set, as deploy/test.sh does); else failed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
build="$(cd "${1:-build}" && pwd)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "=== [deploy-check] FAILED: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null || fail "no $1 (Debian package $2; deploy/install-deps.sh installs it)"; }
step() { echo "=== [deploy-check] $1: ok ($(( $(date +%s%N) / 1000000 - t0 )) ms)"; }

# --- systemd ------------------------------------------------------------------------------------
t0=$(( $(date +%s%N) / 1000000 ))
need systemd-analyze systemd
for bin in master/mc-master client/mc-client; do
  [[ -x "$build/$bin" ]] || fail "no $build/$bin (./deploy/build.sh release)"
done
mkdir -p "$work/units"
units=()
for f in deploy/systemd/*.service; do
  name=$(basename "$f")
  sed -e "s|/usr/local/bin/mc-master|$build/master/mc-master|g" \
      -e "s|/usr/local/bin/mc-client|$build/client/mc-client|g" "$f" >"$work/units/$name"
  # A template is verified through an instance of it.
  units+=("$work/units/${name/@./@main.}")
done
out=$(cd "$work/units" && systemd-analyze verify --man=no "${units[@]}" 2>&1) ||
  fail "systemd-analyze verify: $out"
[[ -z "$out" ]] || fail "systemd-analyze verify warned: $out"
for u in "${units[@]}"; do
  systemd-analyze security --offline=yes --threshold=25 "$u" >"$work/security.txt" 2>&1 || {
    tail -5 "$work/security.txt"
    fail "systemd-analyze security: $(basename "$u") is more exposed than 2.5"
  }
  echo "    $(basename "$u"): $(grep -o 'Overall exposure level.*' "$work/security.txt")"
done
step systemd

# --- Kubernetes ---------------------------------------------------------------------------------
t0=$(( $(date +%s%N) / 1000000 ))
kv="$("$repo/deploy/python-venv.sh" base)/bin/kubernetes-validate"
skipped=""
if [[ ! -x "$kv" ]]; then
  # As the venv's tests do: fail where the venv must exist (deploy/test.sh), else skip this step.
  msg="no $kv (deploy/install-deps.sh builds the venv from deploy/requirements-lock.txt)"
  [[ -z "${MC_REQUIRE_VENV:-}" ]] || fail "$msg"
  echo "=== [deploy-check] k8s: SKIPPED: $msg"
  skipped="k8s"
else
  for v in ${MC_K8S_VERSIONS:-1.30.0 1.37.0}; do
    "$kv" --strict --quiet -k "$v" deploy/k8s/*.yaml ||
      fail "deploy/k8s does not validate against Kubernetes $v"
  done
  step "k8s ($(ls deploy/k8s/*.yaml | wc -l) files, Kubernetes ${MC_K8S_VERSIONS:-1.30.0 1.37.0})"
fi

# --- Prometheus rules ---------------------------------------------------------------------------
t0=$(( $(date +%s%N) / 1000000 ))
tools="${XDG_CACHE_HOME:-$HOME/.cache}/mcstore/tools"
promtool="$tools/promtool"
[[ -x "$promtool" ]] || promtool=$(command -v promtool) ||
  fail "no promtool (deploy/install-deps.sh extracts it into $tools)"
"$promtool" check rules deploy/monitoring/mcstore.rules.yml >"$work/promtool.txt" 2>&1 ||
  { cat "$work/promtool.txt"; fail "promtool check rules"; }
(cd deploy/monitoring && "$promtool" test rules mcstore.rules.test.yml) >"$work/promtool.txt" 2>&1 ||
  { cat "$work/promtool.txt"; fail "promtool test rules"; }
step "rules (check + unit tests)"

# --- Grafana dashboard --------------------------------------------------------------------------
t0=$(( $(date +%s%N) / 1000000 ))
/usr/bin/python3 - deploy/monitoring/grafana-dashboard.json "$work/dashboard.rules.yml" <<'EOF' ||
import json, sys
dash = json.load(open(sys.argv[1]))
exprs = []
def walk(panels):
    for p in panels:
        walk(p.get("panels", []))
        for t in p.get("targets", []):
            exprs.append((p.get("title", "?"), t["expr"]))
walk(dash["panels"])
if not exprs:
    sys.exit("the dashboard has no expression")
with open(sys.argv[2], "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (title, expr) in enumerate(exprs):
        out.write("      - record: dashboard_expr_%d\n        expr: %s\n" % (i, json.dumps(expr)))
print("    %d expressions in %d panels" % (len(exprs), len(dash["panels"])))
EOF
  fail "deploy/monitoring/grafana-dashboard.json is not a dashboard"
"$promtool" check rules "$work/dashboard.rules.yml" >"$work/promtool.txt" 2>&1 ||
  { cat "$work/promtool.txt"; fail "a dashboard expression does not parse"; }
step dashboard
if [[ -n "$skipped" ]]; then
  echo "=== [deploy-check] passed, but skipped: $skipped"
  exit 77  # ctest: SKIP
fi
