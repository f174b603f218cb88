#!/usr/bin/env bash
# Installs every build, test and run dependency of mcstore from Debian 12's packages,
# non-interactively. Returns at once when everything is present.
#   ./deploy/install-deps.sh          build + test + run dependencies
#   ./deploy/install-deps.sh --bench  also the peers the benchmarks compare against
# Then the Python venvs of the client, the engine connectors and their tests (deploy/python-venv.sh:
# the pinned dependencies outside the clone, keyed by the lock file, a no-op once complete; and
# the checkout's own venv over them, with this checkout's mcstore package installed).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git curl
  clang-14 libclang-rt-14-dev clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev liburing-dev libibverbs-dev libspdlog-dev libfmt-dev libxxhash-dev
  libcpp-httplib-dev libgtest-dev libgmock-dev libbenchmark-dev libgoogle-perftools-dev
  python3 python3-grpcio python3-grpc-tools python3-protobuf python3-numpy
  python3-venv libtcmalloc-minimal4 etcd-server
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(fio memcached redis-server redis-tools valgrind)
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
"$(dirname "$0")/python-venv.sh" install
"$(dirname "$0")/python-venv.sh" --sglang install
