#!/usr/bin/env bash
# Installs every build, test and run dependency of mcstore from Debian 12's packages,
# non-interactively. Returns at once when everything is present.
#   ./deploy/install-deps.sh          build + test + run dependencies
#   ./deploy/install-deps.sh --bench  also the peers the benchmarks compare against
# Then promtool (extracted into ~/.cache/mcstore/tools) and the Python venvs of the client, the
# engine connectors and their tests (deploy/python-venv.sh: the pinned dependencies outside the
# clone, keyed by the lock file, a no-op once complete; and the checkout's own venv over them,
# with this checkout's mcstore package installed).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git curl
  clang-14 libclang-rt-14-dev clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev liburing-dev libibverbs-dev libspdlog-dev libfmt-dev libxxhash-dev
  libcpp-httplib-dev libgtest-dev libgmock-dev libbenchmark-dev libgoogle-perftools-dev
  python3 python3-grpcio python3-grpc-tools python3-protobuf python3-numpy
  python3-venv python3-yaml libtcmalloc-minimal4 etcd-server
  # The Soft-RoCE VM of the real-verbs and netem tests (deploy/rxe-vm.sh)
  qemu-system-x86 busybox-static kmod cpio xz-utils iproute2 rdma-core ibverbs-providers
  ibverbs-utils
  # The deployment checks (deploy/check-deploy.sh, tests/integration/deploy): systemd-analyze,
  # headless Chromium for the status page's screenshot
  systemd chromium
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(fio memcached redis-server redis-tools valgrind perftest)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "install-deps: done"
fi
# promtool, Prometheus's rule checker, from Debian's prometheus package: extracted, not installed
# (the package would also start a Prometheus server on a host that runs systemd).
tools="${XDG_CACHE_HOME:-$HOME/.cache}/mcstore/tools"
if [[ ! -x "$tools/promtool" ]]; then
  echo "install-deps: extracting promtool from Debian's prometheus package into $tools"
  dl=$(mktemp -d)
  sandbox=()
  [[ $(id -u) -eq 0 ]] && sandbox=(-o APT::Sandbox::User=root)
  if ! (cd "$dl" && apt-get download -qq "${sandbox[@]}" prometheus 2>/dev/null); then
    if [[ $(id -u) -eq 0 ]]; then apt-get update -qq; else sudo apt-get update -qq; fi
    (cd "$dl" && apt-get download -qq "${sandbox[@]}" prometheus)
  fi
  dpkg-deb -x "$dl"/prometheus_*.deb "$dl/root"
  mkdir -p "$tools"
  install -m 0755 "$dl/root/usr/bin/promtool" "$tools/promtool"
  rm -rf "$dl"
fi
"$(dirname "$0")/python-venv.sh" install
"$(dirname "$0")/python-venv.sh" --sglang install
