#!/usr/bin/env bash
# SSD tier throughput beside fio, in one run, on one directory.
#
# DiskTier figures come from the (disabled by default) throughput test of offload_test:
# 512 MiB of 1, 4 and 16 MiB records written (each fdatasync'ed) then read back and verified,
# one record at a time from one thread, for the io_uring and the posix engine. fio runs the same
# block sizes on the same directory: sequential write (direct=1, fdatasync per block, as the tier
# does per record) then sequential read (direct=1), ioengine=io_uring, iodepth=1 (one block at a
# time, as the tier moves one record at a time) and iodepth=4 (for reference: within a record the
# tier keeps several chunk requests in flight, up to 8). Figures are medians of RUNS runs; ratios
# are tier / fio(iodepth=1).
#
# Then the burst figure (write-back, DESIGN.md invariant 7): bench/burst_put.py puts a burst of
# 10x memory (1 MiB values) into an mc-client with an SSD tier in BENCH_DIR, as fast as it takes
# them, every value to be persisted before its memory is reused; its burst GB/s (last put
# answered) and drain GB/s (last value on SSD) are set beside fio sequential write of the same
# bytes (bs=1M, direct=1, iodepth=4, one fdatasync at the end: the disk's write speed).
#
# Env: MC_BUILD_DIR (default build), BENCH_DIR (default /var/tmp; must not be tmpfs, O_DIRECT),
#      RUNS (default 3), FIO_SIZE (default 512M, as the tier test), BURST (default 1; 0 skips
#      the burst figure), BURST_SEGMENT (default 64 MiB), BURST_FACTOR (default 10),
#      TIER (default 1; 0 skips the per-record tier figures).
set -euo pipefail
# Paths from the environment are taken relative to the caller's directory (absolute ones as
# they are); the defaults are relative to the repository root.
caller_dir="$PWD"
abs_path() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$caller_dir/$1" ;; esac; }
cd "$(dirname "$0")/.."
if [[ -n "${MC_BUILD_DIR:-}" ]]; then BUILD="$(abs_path "$MC_BUILD_DIR")"; else BUILD="$PWD/build"; fi
BIN="$BUILD/tests/unit/offload/offload_test"
BENCH_DIR="$(abs_path "${BENCH_DIR:-/var/tmp}")"
RUNS=${RUNS:-3}
FIO_SIZE=${FIO_SIZE:-512M}
[[ -x "$BIN" ]] || { echo "missing $BIN (build offload_test)" >&2; exit 1; }
command -v fio >/dev/null || { echo "fio not installed (deploy/install-deps.sh --bench)" >&2; exit 1; }
WORK=$(mktemp -d "$BENCH_DIR/mc-offload-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
LOG="$WORK/raw.log"
echo "# dir $BENCH_DIR ($(df -T "$BENCH_DIR" | awk 'NR==2{print $2}')), runs=$RUNS, $(nproc) cores"

median() { sort -g | awk '{a[NR]=$1} END{ if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2 }'; }

fio_gbps() {  # rw bs iodepth -> GB/s
  local rw=$1 bs=$2 depth=$3 extra=()
  [[ $rw == write ]] && extra=(--fdatasync=1)
  fio --name=mc --directory="$WORK" --filename=fio.dat --rw="$rw" --bs="$bs" --size="$FIO_SIZE" \
      --ioengine=io_uring --direct=1 --iodepth="$depth" --numjobs=1 --group_reporting \
      --output-format=json "${extra[@]}" 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; k="write" if j["write"]["io_bytes"] else "read"; print("%.3f" % (j[k]["bw_bytes"]/1e9))'
}

for run in $(seq "$RUNS"); do
  [[ ${TIER:-1} == 1 ]] || break
  TEST_TMPDIR="$WORK/" "$BIN" --gtest_also_run_disabled_tests --gtest_filter='*Throughput*' |
    grep '^\[throughput\]' | sed "s/^/run=$run /" >>"$LOG"
  for bs in 1M 4M 16M; do
    for depth in 1 4; do
      w=$(fio_gbps write $bs $depth); r=$(fio_gbps read $bs $depth)
      echo "run=$run fio bs=$bs depth=$depth write $w read $r" >>"$LOG"
      rm -f "$WORK/fio.dat"
    done
  done
done

tier() {  # engine size(MiB) write|read
  grep "engine=$1 record=$(printf '%3d' "$2") MiB" "$LOG" |
    sed -E "s/.*$3 ([0-9.]+) GB\/s.*/\1/" | median
}
fio_m() {  # bs depth write|read
  grep "fio bs=$1 depth=$2 " "$LOG" | sed -E "s/.*$3 ([0-9.]+).*/\1/" | median
}
if [[ ${TIER:-1} == 1 ]]; then
printf '\n| record | tier io_uring W / R GB/s | tier posix W / R | fio qd1 W / R | fio qd4 W / R | io_uring / fio qd1 W, R |\n'
printf '|---|---|---|---|---|---|\n'
for mib in 1 4 16; do
  uw=$(tier io_uring $mib write); ur=$(tier io_uring $mib read)
  pw=$(tier posix $mib write); pr=$(tier posix $mib read)
  f1w=$(fio_m ${mib}M 1 write); f1r=$(fio_m ${mib}M 1 read)
  f4w=$(fio_m ${mib}M 4 write); f4r=$(fio_m ${mib}M 4 read)
  printf '| %d MiB | %s / %s | %s / %s | %s / %s | %s / %s | %.2f×, %.2f× |\n' "$mib" \
    "$uw" "$ur" "$pw" "$pr" "$f1w" "$f1r" "$f4w" "$f4r" \
    "$(python3 -c "print($uw/$f1w)")" "$(python3 -c "print($ur/$f1r)")"
done
fi

if [[ ${BURST:-1} == 1 ]]; then
  seg=${BURST_SEGMENT:-$((64 << 20))}
  factor=${BURST_FACTOR:-10}
  bytes=$((seg * factor))
  for run in $(seq "$RUNS"); do
    MC_BUILD_DIR="$BUILD" BENCH_DIR="$WORK" SEGMENT=$seg FACTOR=$factor SSD=$((bytes * 2)) \
      /usr/bin/python3 bench/burst_put.py | grep '^burst_put' | sed "s/^/run=$run /" >>"$LOG"
    w=$(fio --name=mc --directory="$WORK" --filename=fio.dat --rw=write --bs=1M \
          --size="$bytes" --ioengine=io_uring --direct=1 --iodepth=4 --end_fsync=1 \
          --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print("%.3f" % (j["write"]["bw_bytes"]/1e9))')
    rm -f "$WORK/fio.dat"
    echo "run=$run fio burst-seq-write $w" >>"$LOG"
  done
  bw=$(grep ' burst_put ' "$LOG" | sed -E 's/.*burst_GBps=([0-9.]+).*/\1/' | median)
  dw=$(grep ' burst_put ' "$LOG" | sed -E 's/.*drain_GBps=([0-9.]+).*/\1/' | median)
  fw=$(grep 'fio burst-seq-write' "$LOG" | awk '{print $NF}' | median)
  printf '\n| burst of %dx %d MiB memory | put GB/s (burst) | all on SSD GB/s (drain) | fio seq write GB/s | burst / fio | drain / fio |\n' \
    "$factor" "$((seg >> 20))"
  printf '|---|---|---|---|---|---|\n'
  printf '| 1 client, 1 MiB values | %s | %s | %s | %.2f× | %.2f× |\n' "$bw" "$dw" "$fw" \
    "$(python3 -c "print($bw/$fw)")" "$(python3 -c "print($dw/$fw)")"
  grep ' burst_put ' "$LOG" | sed 's/^/# /'
fi
echo; echo "# raw lines: $LOG (removed at exit; copy it with KEEP_LOG=path)"
[[ -n "${KEEP_LOG:-}" ]] && cp "$LOG" "$KEEP_LOG"
exit 0
