#!/usr/bin/env bash
# For a newcomer: installs the dependencies, builds mcstore, starts a local cluster (one master,
# two clients), puts data through one client and reads it back through the other over the TCP
# data plane, prints the master's /status, and stops the cluster.
set -euo pipefail
# Paths from the environment are taken relative to the caller's directory (absolute ones as
# they are); the defaults are relative to the repository root.
caller_dir="$PWD"
abs_path() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$caller_dir/$1" ;; esac; }
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
./deploy/build.sh release mc-master mc-client mc-admin mc_proto_python
# Absolute from here on: local-cluster.sh and the commands below then agree on it.
if [[ -n "${MC_RUN_DIR:-}" ]]; then MC_RUN_DIR="$(abs_path "$MC_RUN_DIR")"; else MC_RUN_DIR="$PWD/run/quickstart"; fi
export MC_RUN_DIR
export MC_SEGMENT_SIZE="${MC_SEGMENT_SIZE:-134217728}"
trap './deploy/local-cluster.sh stop >/dev/null' EXIT
# TLS on every TCP listener (master and Store); a throwaway CA in $MC_RUN_DIR/tls.
export MC_TLS="${MC_TLS:-all}"
./deploy/local-cluster.sh start 2
# The clients' TCP Store listeners want the cluster's token; mc-admin reads it from here.
export MCSTORE_TOKEN_FILE="$MC_RUN_DIR/store.token"

field() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
master=$(field "$MC_RUN_DIR/master.json" grpc)
c1=$(field "$MC_RUN_DIR/client1.json" grpc)
c2=$(field "$MC_RUN_DIR/client2.json" grpc)
admin=(build/tools/mc-admin)
if [[ "$MC_TLS" != 0 ]]; then admin+=(--tls_ca_file "$MC_RUN_DIR/tls/ca.pem"); fi
demo="$MC_RUN_DIR/demo"
mkdir -p "$demo"

echo "--- demo: 8 blocks of 1 MiB put through client1, read back through client2"
for i in $(seq 0 7); do
  head -c 1048576 /dev/urandom >"$demo/block$i"
  "${admin[@]}" --client "$c1" put "$demo/block$i" "demo/block$i"
done
for i in $(seq 0 7); do
  "${admin[@]}" --client "$c2" get "demo/block$i" "$demo/back$i"
  cmp "$demo/block$i" "$demo/back$i"
done
echo "--- a 24 MiB block through shared memory"
head -c $((24 << 20)) /dev/urandom >"$demo/big"
"${admin[@]}" --client "unix:$MC_RUN_DIR/client1.sock" put "$demo/big" demo/big
"${admin[@]}" --client "$c2" get demo/big "$demo/big.back"
cmp "$demo/big" "$demo/big.back"
echo "--- all bytes read back equal"
"${admin[@]}" --client "$c2" exist demo/block0 demo/nothing-here || true
echo "--- cluster status"
"${admin[@]}" --master "$master" --cluster_secret_file "$MC_RUN_DIR/cluster.secret" status
echo "--- master /status"
curl -fsS "http://$(field "$MC_RUN_DIR/master.json" http)/status"
rm -rf "$demo"
