#!/usr/bin/env bash
# A local mcstore cluster on loopback: one mc-master and N mc-client daemons, free ports, logs and
# ready files in one run directory.
#   ./deploy/local-cluster.sh start N   (default 2)
#   ./deploy/local-cluster.sh status
#   ./deploy/local-cluster.sh restart master|clientI [--kill]
#       stops one daemon (SIGTERM; --kill: SIGKILL, a crash) and starts it again with the same
#       flags, socket and id (the master on the same gRPC port); returns once it serves again:
#       a client registered with the master, every client registered again with a new master
#   ./deploy/local-cluster.sh stop
# Environment: MC_BUILD_DIR (default build), MC_RUN_DIR (default run/cluster),
#   MC_SEGMENT_SIZE bytes per client (default 268435456), MC_CLIENT_ARGS / MC_MASTER_ARGS extra flags,
#   MC_CLIENT<i>_ARGS extra flags of client i only (after MC_CLIENT_ARGS: a flag given in both
#   takes this value; e.g. MC_CLIENT1_ARGS="--segment_size 0" makes client1 a pure client),
#   MC_AUTH=0 for an unauthenticated cluster (default: a cluster secret in the run directory,
#   run/cluster/cluster.secret, given to the master, and a member credential per client issued
#   from it, run/cluster/clientI.member; MC_MEMBERS=0 gives the clients the secret instead;
#   mc-admin needs --cluster_secret_file too),
#   MC_TLS: "master" (default) serves the master's gRPC over TLS, "all" also the clients' TCP Store
#   listeners, 0 none. The certificates (a throwaway CA, one certificate for 127.0.0.1/localhost)
#   are made once into run/cluster/tls/ (deploy/make-tls-certs.sh); tools then need
#   --tls_ca_file run/cluster/tls/ca.pem (mc-admin, mc-bench) or tls= (Python).
set -euo pipefail
# Paths from the environment are taken relative to the caller's directory (absolute ones as
# they are); the defaults are relative to the repository root.
caller_dir="$PWD"
abs_path() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$caller_dir/$1" ;; esac; }
cd "$(dirname "$0")/.."
repo="$PWD"
if [[ -n "${MC_BUILD_DIR:-}" ]]; then build="$(abs_path "$MC_BUILD_DIR")"; else build="$repo/build"; fi
if [[ -n "${MC_RUN_DIR:-}" ]]; then run="$(abs_path "$MC_RUN_DIR")"; else run="$repo/run/cluster"; fi
segment="${MC_SEGMENT_SIZE:-268435456}"

field() {  # field FILE KEY: a value of a ready file
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

wait_ready() {  # wait_ready FILE PID NAME
  for _ in $(seq 1 100); do
    [[ -s "$1" ]] && return 0
    if ! kill -0 "$2" 2>/dev/null; then
      echo "local-cluster: $3 exited; its log:" >&2
      tail -20 "$run/$3.log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "local-cluster: $3 not ready after 10 s (log: $run/$3.log)" >&2
  return 1
}

launch() {  # launch NAME COMMAND...: starts a daemon in the background, keeps its command line
  local name="$1"
  shift
  printf '%s\0' "$@" >"$run/$name.cmd"
  "$@" >"$run/$name.log" 2>&1 &
  echo $! >"$run/$name.pid"
}

stop_one() {  # stop_one NAME [SIGNAL]: ends a daemon and waits for it (bounded)
  local pidfile="$run/$1.pid" sig="${2:-TERM}"
  [[ -e "$pidfile" ]] || return 0
  local pid
  pid=$(cat "$pidfile")
  kill "-$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

registrations() {  # registrations: "client1=N client2=M ..." (mc_client_registrations)
  local out=""
  for f in "$run"/client*.json; do
    [[ -e "$f" ]] || continue
    local n
    n=$(curl -fsS "http://$(field "$f" http)/metrics" 2>/dev/null |
      awk '$1 == "mc_client_registrations" {print $2}')
    out+="$(basename "$f" .json)=${n:-0} "
  done
  echo "$out"
}

restart() {  # restart master|clientI [--kill]
  local name="$1" sig=TERM
  [[ "${2:-}" == "--kill" ]] && sig=KILL
  [[ -s "$run/$name.cmd" ]] || { echo "local-cluster: no daemon $name in $run" >&2; exit 1; }
  local cmd=()
  while IFS= read -r -d '' arg; do cmd+=("$arg"); done <"$run/$name.cmd"
  local before
  before=$(registrations)
  if [[ "$name" == master ]]; then
    # Same gRPC port: the clients know the master by it (absl takes the last --listen).
    cmd+=(--listen "$(field "$run/master.json" grpc)")
  fi
  stop_one "$name" "$sig"
  rm -f "$run/$name.json"
  "${cmd[@]}" >>"$run/$name.log" 2>&1 &
  echo $! >"$run/$name.pid"
  wait_ready "$run/$name.json" "$(cat "$run/$name.pid")" "$name"
  # Serving again means registered: a restarted client (with its old id: once the master lets
  # it take over), every client with a restarted master.
  local deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    local now ok=1
    now=$(registrations)
    for entry in $now; do
      local client="${entry%%=*}" count="${entry#*=}" old=0
      for b in $before; do [[ "${b%%=*}" == "$client" ]] && old="${b#*=}"; done
      if [[ "$name" == master || "$name" == "$client" ]]; then
        [[ "$name" == "$client" ]] && old=0   # a new process counts from 0
        ((count > old)) || ok=0
      fi
    done
    ((ok)) && { echo "local-cluster: $name restarted (registrations: $now)"; return 0; }
    sleep 0.1
  done
  echo "local-cluster: $name restarted but not every client registered again within 60 s" >&2
  return 1
}

stop() {
  [[ -d "$run" ]] || return 0
  for pidfile in "$run"/*.pid; do
    [[ -e "$pidfile" ]] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
  echo "local-cluster: stopped ($run)"
}

start() {
  local n="${1:-2}"
  for bin in master/mc-master client/mc-client; do
    [[ -x "$build/$bin" ]] || { echo "local-cluster: $build/$bin missing: build first (./deploy/build.sh)" >&2; exit 1; }
  done
  stop >/dev/null
  mkdir -p "$run"
  rm -f "$run"/*.json "$run"/*.sock "$run"/*.sock.fd
  # The Store token of the clients' TCP listeners (tools: --token_file / $MCSTORE_TOKEN_FILE).
  if [[ ! -s "$run/store.token" ]]; then
    (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$run/store.token")
  fi
  chmod 600 "$run/store.token"
  # Authentication on by default: a cluster secret generated into the run directory (kept across
  # restarts of the cluster); MC_AUTH=0 runs an unauthenticated cluster (benchmarks).
  local auth=(--auth=false)
  if [[ "${MC_AUTH:-1}" != 0 ]]; then
    if [[ ! -s "$run/cluster.secret" ]]; then
      (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$run/cluster.secret" && echo >>"$run/cluster.secret")
    fi
    auth=(--cluster_secret_file "$run/cluster.secret")
  fi
  # Each client gets its own member credential (docs/security.md "Member credentials"), issued
  # from the secret into the run directory; MC_MEMBERS=0 gives the clients the secret itself.
  member_args() {  # sets client_auth for client $1
    client_auth=("${auth[@]}")
    [[ "${MC_AUTH:-1}" == 0 || "${MC_MEMBERS:-1}" == 0 ]] && return 0
    local cred="$run/client$1.member"
    # Issued once; again when the secret is newer than it (a credential of another secret).
    if [[ ! -s "$cred" || "$cred" -ot "$run/cluster.secret" ]]; then
      rm -f "$cred"
      "$build/tools/mc-admin" --cluster_secret_file "$run/cluster.secret" issue-member \
        --client_id "client$1" --out "$cred" >/dev/null
    fi
    client_auth=(--member_credential_file "$cred")
  }
  local client_auth=()
  # TLS (docs/security.md): on the master's listener by default (small RPCs: it costs little);
  # MC_TLS=all also on the Store TCP listeners (inline payloads), MC_TLS=0 off.
  local master_tls=() client_tls=()
  case "${MC_TLS:-master}" in
    0) ;;
    master | all)
      ./deploy/make-tls-certs.sh "$run/tls"
      master_tls=(--tls_cert_file "$run/tls/cert.pem" --tls_key_file "$run/tls/cert.key")
      client_tls=(--master_tls_ca_file "$run/tls/ca.pem")
      [[ "${MC_TLS:-master}" == all ]] && client_tls+=("${master_tls[@]}")
      ;;
    *) echo "local-cluster: MC_TLS must be master, all or 0" >&2; exit 2 ;;
  esac
  launch master "$build/master/mc-master" --listen 127.0.0.1:0 --http 127.0.0.1:0 "${auth[@]}" \
    "${master_tls[@]}" --ready_file "$run/master.json" ${MC_MASTER_ARGS:-}
  wait_ready "$run/master.json" "$(cat "$run/master.pid")" master
  local master
  master=$(field "$run/master.json" grpc)
  for i in $(seq 1 "$n"); do
    local per="MC_CLIENT${i}_ARGS"
    member_args "$i"
    launch "client$i" "$build/client/mc-client" --master "$master" --listen 127.0.0.1:0 \
      --http 127.0.0.1:0 --data 127.0.0.1:0 --unix_socket "$run/client$i.sock" \
      --client_id "client$i" "${client_auth[@]}" --store_token_file "$run/store.token" "${client_tls[@]}" \
      --segment_size "$segment" --ready_file "$run/client$i.json" ${MC_CLIENT_ARGS:-} ${!per:-}
  done
  for i in $(seq 1 "$n"); do
    wait_ready "$run/client$i.json" "$(cat "$run/client$i.pid")" "client$i"
  done
  echo "local-cluster: master gRPC $master, HTTP $(field "$run/master.json" http), Store token $run/store.token"
  ((${#master_tls[@]})) && echo "local-cluster: TLS (${MC_TLS:-master}), CA $run/tls/ca.pem"
  for i in $(seq 1 "$n"); do
    echo "local-cluster: client$i Store $(field "$run/client$i.json" grpc) (unix:$run/client$i.sock), HTTP $(field "$run/client$i.json" http)"
  done
}

status() {
  [[ -s "$run/master.json" ]] || { echo "local-cluster: not running"; return 1; }
  curl -fsS "http://$(field "$run/master.json" http)/status"
  for f in "$run"/client*.json; do
    [[ -e "$f" ]] || continue
    curl -fsS "http://$(field "$f" http)/status" || echo "$(basename "$f" .json): not answering"
  done
}

case "${1:-}" in
  start) start "${2:-2}" ;;
  stop) stop ;;
  status) status ;;
  restart) restart "${2:?restart master|clientI [--kill]}" "${3:-}" ;;
  *) echo "usage: $0 start [N] | status | restart master|clientI [--kill] | stop" >&2; exit 2 ;;
esac
