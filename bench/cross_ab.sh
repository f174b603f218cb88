#!/usr/bin/env bash
# A/B of the receiving daemon's tcp data-plane flags for cross-daemon gets, in one cluster:
# client1 runs with A_ARGS, client2 with B_ARGS (after MC_CLIENT_ARGS); each round gets values
# of each size both ways (put through one daemon, got through the other: the getter's daemon
# receives), A then B, alternating which goes first. Prints per round GB/s of each and B/A, then
# the medians. Both daemons serve with their own flags, so only receive-side flags (and those a
# connection's requester sets) compare cleanly. SWAP=1 runs the same with the roles exchanged.
# Environment: see bench/lib.sh; SIZES (default "65536 1048576 4194304"), ROUNDS (default 4),
# A_ARGS, B_ARGS. Prints figures, asserts nothing (bench/README.md, "Cross gets over tcp: where the
# time goes").
set -euo pipefail
source "$(dirname "$0")/lib.sh"
SIZES="${SIZES:-65536 1048576 4194304}"
ROUNDS="${ROUNDS:-4}"
if [[ "${SWAP:-0}" == 1 ]]; then
  export MC_CLIENT1_ARGS="${B_ARGS:-}" MC_CLIENT2_ARGS="${A_ARGS:-}"
else
  export MC_CLIENT1_ARGS="${A_ARGS:-}" MC_CLIENT2_ARGS="${B_ARGS:-}"
fi
start_mcstore
mkdir -p "$MC_RUN_DIR"
A_GET="$CLIENT1" A_PUT="$CLIENT2"
[[ "${SWAP:-0}" == 1 ]] && A_GET="$CLIENT2" A_PUT="$CLIENT1"
echo "cross_ab: A='${A_ARGS:-}' B='${B_ARGS:-}' swap=${SWAP:-0} rounds=$ROUNDS" >&2
for size in $SIZES; do
  keys="$(keys_for "$size")"
  iters=$(( size >= 16777216 ? 8 : 20 ))
  common=(--value_size "$size" --batch 16 --keys "$keys" --iterations "$iters" --runs 1 --dest shm)
  a_gbs=() b_gbs=()
  for r in $(seq 1 "$ROUNDS"); do
    # The getter's daemon receives: A's is client1 unless SWAP.
    get_a() { mcbench --put_client "$A_PUT" --client "$A_GET" --mode get "${common[@]}"; }
    get_b() { mcbench --put_client "$A_GET" --client "$A_PUT" --mode get "${common[@]}"; }
    if (( r % 2 )); then la="$(get_a)"; lb="$(get_b)"; else lb="$(get_b)"; la="$(get_a)"; fi
    ga="$(field "$la" GB/s)"; gb="$(field "$lb" GB/s)"
    a_gbs+=("$ga"); b_gbs+=("$gb")
    printf 'cross_ab size=%s round=%d A=%s B=%s B/A=%s load=%s\n' "$size" "$r" "$ga" "$gb" \
      "$(ratio "$gb" "$ga")" "$(cut -d' ' -f1 /proc/loadavg)"
  done
  med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  ma="$(med "${a_gbs[@]}")"; mb="$(med "${b_gbs[@]}")"
  printf 'cross_ab size=%s median A=%s B=%s B/A=%s\n' "$size" "$ma" "$mb" "$(ratio "$mb" "$ma")"
done
