#!/usr/bin/env bash
# What authentication costs (docs/security.md): the same cluster (master + 2 mc-clients on
# loopback) started alternately with authentication on (the default: cluster secret, master RPC
# sessions, data-plane handshake and capabilities) and off (MC_AUTH=0, --auth=false), REPS times
# each. Per run: cross-daemon gets of 4 MiB values (put through client1, got through client2:
# every byte crosses the TCP data plane) in GB/s, and small cross-daemon gets (one 4 KiB value per
# call) p50/p99 in ms. Prints every run and the medians with the ratio on/off.
#   ./bench/auth_cost.sh              REPS=5 ./bench/auth_cost.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
REPS="${REPS:-3}"

declare -A gbps p50 p99
for ((rep = 1; rep <= REPS; rep++)); do
  for auth in 1 0; do
    MC_AUTH=$auth start_mcstore
    c1="unix:$MC_RUN_DIR/client1.sock"
    c2="unix:$MC_RUN_DIR/client2.sock"
    big="$(mcbench --put_client "$c1" --client "$c2" --mode get --value_size 4MiB --keys 64 \
      --batch 16 --iterations 20 --runs 1)"
    small="$(mcbench --put_client "$c1" --client "$c2" --mode get --value_size 4KiB --keys 1024 \
      --batch 1 --iterations 2000 --runs 1)"
    ./deploy/local-cluster.sh stop >/dev/null
    g="$(field "$big" GB/s)"
    s50="$(field "$small" p50_ms)"
    s99="$(field "$small" p99_ms)"
    printf 'rep=%d auth=%d cross_get_4MiB_GB/s=%s small_get_p50_ms=%s small_get_p99_ms=%s\n' \
      "$rep" "$auth" "$g" "$s50" "$s99"
    gbps[$auth]+="$g "
    p50[$auth]+="$s50 "
    p99[$auth]+="$s99 "
  done
done

median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END { if (NR) print a[int((NR+1)/2)]; else print "-" }'; }
echo "medians over $REPS runs (auth on / off = ratio):"
printf '  cross-daemon get 4 MiB GB/s: %s / %s = %s\n' "$(median "${gbps[1]}")" \
  "$(median "${gbps[0]}")" "$(ratio "$(median "${gbps[1]}")" "$(median "${gbps[0]}")")"
printf '  small get p50 ms:            %s / %s = %s\n' "$(median "${p50[1]}")" \
  "$(median "${p50[0]}")" "$(ratio "$(median "${p50[1]}")" "$(median "${p50[0]}")")"
printf '  small get p99 ms:            %s / %s = %s\n' "$(median "${p99[1]}")" \
  "$(median "${p99[0]}")" "$(ratio "$(median "${p99[1]}")" "$(median "${p99[0]}")")"
