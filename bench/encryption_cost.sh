#!/usr/bin/env bash
# What the encrypted data plane costs (docs/security.md, "The data plane"): the same cluster
# (master + 2 mc-clients on loopback, --auth on) started alternately with --data_encryption=on
# (the default) and off, REPS rounds each, interleaved. Per run: cross-daemon gets (put through
# client1, got through client2: every byte crosses the TCP data plane) of 64 KiB, 1 MiB and 4 MiB
# values in batches of 16, GB/s and CPU s/GB (mc-bench's own and the daemons'). Prints every run
# and the medians with the ratio on/off. No assertion: a program that prints figures.
#   ./bench/encryption_cost.sh              REPS=5 ./bench/encryption_cost.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
REPS="${REPS:-3}"
SIZES="${SIZES:-64KiB 1MiB 4MiB}"

keys_for() {  # about 256 MiB per run, at least 64 keys
  case "$1" in
    64KiB) echo 1024 ;;
    1MiB) echo 256 ;;
    *) echo 64 ;;
  esac
}

declare -A gbps cpu dcpu
for ((rep = 1; rep <= REPS; rep++)); do
  for enc in on off; do
    MC_CLIENT_ARGS="--data_encryption=$enc ${MC_CLIENT_ARGS_EXTRA:-}" start_mcstore
    c1="unix:$MC_RUN_DIR/client1.sock"
    c2="unix:$MC_RUN_DIR/client2.sock"
    for size in $SIZES; do
      line="$(mcbench --put_client "$c1" --client "$c2" --mode get --value_size "$size" \
        --keys "$(keys_for "$size")" --batch 16 --iterations 20 --runs 1)"
      g="$(field "$line" GB/s)"
      c="$(field "$line" cpu_s/GB)"
      d="$(field "$line" daemons_cpu_s/GB)"
      printf 'rep=%d data_encryption=%s value_size=%s cross_get_GB/s=%s cpu_s/GB=%s daemons_cpu_s/GB=%s\n' \
        "$rep" "$enc" "$size" "$g" "$c" "$d"
      gbps[$enc,$size]+="$g "
      cpu[$enc,$size]+="$c "
      dcpu[$enc,$size]+="$d "
    done
    ./deploy/local-cluster.sh stop >/dev/null
  done
done

median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END { if (NR) print a[int((NR+1)/2)]; else print "-" }'; }
echo "medians over $REPS rounds (encryption on / off = ratio):"
for size in $SIZES; do
  on="$(median "${gbps[on,$size]}")"
  off="$(median "${gbps[off,$size]}")"
  printf '  %-6s x16 cross get GB/s: %s / %s = %s   mc-bench cpu_s/GB: %s / %s   daemons_cpu_s/GB: %s / %s\n' \
    "$size" "$on" "$off" "$(ratio "$on" "$off")" "$(median "${cpu[on,$size]}")" \
    "$(median "${cpu[off,$size]}")" "$(median "${dcpu[on,$size]}")" "$(median "${dcpu[off,$size]}")"
done
