#!/usr/bin/env bash
# Runs a command of this machine inside a throw-away qemu VM that has a Soft-RoCE (rdma_rxe)
# device `rxe0`, for the tests that need a stock kernel: real verbs and tc netem.
#
#   deploy/rxe-vm.sh --setup          prepare the cached image only (no VM); exit 0 when ready
#   deploy/rxe-vm.sh [--] CMD [ARGS]  run CMD in the VM; exits with CMD's status
#                                     (124: timed out, 125: the VM failed before CMD ended)
#
# The guest boots Debian's own kernel (the package linux-image-amd64 points at, downloaded with
# apt-get and extracted into the cache, never installed) with a small busybox initramfs. Its root
# file system is this machine's "/" shared read-only over virtio-9p under a tmpfs overlay, so the
# binaries built here run unchanged at the same paths and the guest may write anywhere (writes
# vanish with the VM; RXE_VM_RW names directories whose writes should come back). CMD runs as root
# in the current directory with this shell's environment, `ulimit -l unlimited`, stdin /dev/null;
# its stdout and stderr stream back live. The VM has no NIC: no packet leaves it. In the guest:
# dummy netdev rxenet0 ($RXE_VM_IPV4/24), RDMA device rxe0 on it (GID 1 = the IPv4-mapped RoCEv2
# GID), modules rdma_rxe, ib_uverbs, rdma_ucm loaded; sch_netem is there too.
#
# Needs the Debian packages deploy/install-deps.sh installs (qemu-system-x86, busybox-static,
# kmod, cpio, xz-utils, iproute2, rdma-core, ibverbs-providers) and apt access once for the
# kernel. The image (kernel, modules, initramfs: about 400 MB) is cached in
# ${XDG_CACHE_HOME:-~/.cache}/mcstore/rxe-vm and reused; delete the folder to rebuild it.
#
# Environment: RXE_VM_DIR (the cache folder), RXE_VM_ACCEL (kvm|tcg|auto; auto uses kvm only
# when kvm_intel or kvm_amd is loaded: a /dev/kvm from another module, e.g. kvm_pvm, ran a stock
# kernel far slower than tcg), RXE_VM_MEM (MiB, 1024), RXE_VM_SMP (vCPUs, nproc),
# RXE_VM_TIMEOUT (seconds for the whole run, 900), RXE_VM_RW (colon list of directories mounted
# read-write at the same path), RXE_VM_MTU (1500), RXE_VM_IPV4 (192.0.2.1, TEST-NET-1, exists
# only in the guest), RXE_VM_VERBOSE=1 (print the guest console), RXE_VM_KEEP=1 (keep the run
# folder), RXE_VM_APPEND (extra kernel command line), RXE_VM_QEMU_ARGS (extra qemu arguments).
set -euo pipefail

RXE_VM_DIR=${RXE_VM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mcstore/rxe-vm}
RXE_VM_ACCEL=${RXE_VM_ACCEL:-auto}
RXE_VM_MEM=${RXE_VM_MEM:-1024}
RXE_VM_SMP=${RXE_VM_SMP:-$(nproc)}
RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-900}
RXE_VM_RW=${RXE_VM_RW:-}
RXE_VM_IPV4=${RXE_VM_IPV4:-192.0.2.1}
RXE_VM_MTU=${RXE_VM_MTU:-1500}
RXE_VM_VERBOSE=${RXE_VM_VERBOSE:-0}
RXE_VM_KEEP=${RXE_VM_KEEP:-0}

# The Debian packages the VM needs on this machine; deploy/install-deps.sh installs them.
PKGS=(qemu-system-x86 busybox-static kmod cpio xz-utils iproute2 rdma-core ibverbs-providers)
# Modules the initramfs loads before the host root is mounted, in load order.
EARLY_MODS=(virtio_pci 9pnet_virtio 9p overlay virtio_console)

log() { echo "rxe-vm: $*" >&2; }
die() { log "$*"; exit 125; }

check_packages() {
  local p missing=()
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]} == 0)) || die "missing Debian packages ${missing[*]} (run deploy/install-deps.sh)"
}

fetch_kernel() {
  local kpkg
  kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
         awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  if [[ -z $kpkg ]]; then
    log "apt-get update (to find linux-image-amd64)"
    if [[ $(id -u) -eq 0 ]]; then apt-get update -qq >&2; else sudo apt-get update -qq >&2; fi
    kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  fi
  [[ -n $kpkg ]] || die "apt knows no linux-image-amd64"
  log "fetching the kernel package $kpkg"
  local -a sandbox=()
  # As root apt drops to the _apt user, who cannot write into root's cache folder.
  [[ $(id -u) -eq 0 ]] && sandbox=(-o APT::Sandbox::User=root)
  rm -rf "$RXE_VM_DIR/dl" "$RXE_VM_DIR/kroot.tmp"
  mkdir -p "$RXE_VM_DIR/dl"
  (cd "$RXE_VM_DIR/dl" && apt-get download -qq "${sandbox[@]}" "$kpkg") ||
    die "apt-get download $kpkg failed"
  dpkg-deb -x "$RXE_VM_DIR"/dl/linux-image-*.deb "$RXE_VM_DIR/kroot.tmp"
  rm -rf "$RXE_VM_DIR/dl"
  local kv
  kv=$(ls "$RXE_VM_DIR/kroot.tmp/lib/modules")
  depmod -b "$RXE_VM_DIR/kroot.tmp" "$kv"
  rm -rf "$RXE_VM_DIR/kroot"
  mv "$RXE_VM_DIR/kroot.tmp" "$RXE_VM_DIR/kroot"
  rm -f "$RXE_VM_DIR/initramfs.cpio.gz" "$RXE_VM_DIR/vmlinux"
}

# The uncompressed ELF vmlinux boots through its PVH entry point and skips the XZ decompression
# that costs ~7 s under tcg; without it the bzImage boots (slower).
extract_vmlinux() {
  local bz off
  bz=$(ls "$RXE_VM_DIR"/kroot/boot/vmlinuz-* | head -1)
  off=$(LC_ALL=C grep -aboP '\xfd7zXZ\x00' "$bz" | head -1 | cut -d: -f1 || true)
  # xz stops at the end of its stream; tail may then die of SIGPIPE.
  if [[ -n $off ]] && (set +o pipefail; tail -c +$((off + 1)) "$bz" |
        xz -dc --single-stream >"$RXE_VM_DIR/vmlinux.tmp" 2>/dev/null) &&
     [[ $(head -c 4 "$RXE_VM_DIR/vmlinux.tmp" | od -An -tx1 | tr -d ' ') == 7f454c46 ]]; then
    mv "$RXE_VM_DIR/vmlinux.tmp" "$RXE_VM_DIR/vmlinux"
  else
    log "could not extract vmlinux; booting the bzImage (slower)"
    rm -f "$RXE_VM_DIR/vmlinux.tmp"
  fi
}

build_initramfs() {
  local kv kr ir m f
  kr=$RXE_VM_DIR/kroot
  kv=$(ls "$kr/lib/modules")
  ir=$(mktemp -d "$RXE_VM_DIR/initramfs.XXXXXX")
  mkdir -p "$ir"/{bin,dev,proc,sys,mods,lower,rw,newroot}
  cp "$(command -v busybox)" "$ir/bin/busybox"
  : >"$ir/mods/order"
  for m in "${EARLY_MODS[@]}"; do
    modprobe -d "$kr" -S "$kv" --show-depends "$m" | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++' | while read -r f; do
    cp "$f" "$ir/mods/"
    basename "$f" >>"$ir/mods/order"
  done
  # Stage 1, PID 1 of the initramfs: mount "/" of the host read-only with a tmpfs overlay, the
  # run's share, the read-write folders, then switch to stage 2 (written per run).
  cat >"$ir/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs dev /dev
fail() { echo "rxe-vm stage1: $*"; sleep 1; poweroff -f; }
for m in $(cat /mods/order); do insmod /mods/$m || echo "insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /lower || fail "mount hostroot"
mount -t tmpfs -o mode=755 rw /rw; mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot || fail "mount overlay"
mount -t tmpfs -o mode=755 run /newroot/run
mkdir -p /newroot/run/rxevm /newroot/run/rxevm-init
mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=512000 rxevm /newroot/run/rxevm || fail "mount rxevm"
cp /bin/busybox /newroot/run/rxevm-init/busybox
i=0
if [ -f /newroot/run/rxevm/rwpaths ]; then
  while read -r p; do
    mount -t 9p -o trans=virtio,version=9p2000.L,rw,cache=mmap,msize=512000 rw$i "/newroot$p" || fail "mount rw$i at $p"
    i=$((i+1))
  done < /newroot/run/rxevm/rwpaths
fi
mount --move /proc /newroot/proc; mount --move /sys /newroot/sys; mount --move /dev /newroot/dev
exec switch_root /newroot /run/rxevm-init/busybox sh /run/rxevm/stage2
EOF
  chmod +x "$ir/init"
  (cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) >"$RXE_VM_DIR/initramfs.cpio.gz.tmp"
  mv "$RXE_VM_DIR/initramfs.cpio.gz.tmp" "$RXE_VM_DIR/initramfs.cpio.gz"
  rm -rf "$ir"
}

setup() {
  check_packages
  mkdir -p "$RXE_VM_DIR"
  # One preparation at a time (two test runs starting together share the cache).
  exec {lockfd}>"$RXE_VM_DIR/.lock"
  flock "$lockfd"
  ls "$RXE_VM_DIR"/kroot/boot/vmlinuz-* >/dev/null 2>&1 || fetch_kernel
  [[ -s $RXE_VM_DIR/vmlinux ]] || extract_vmlinux
  [[ -f $RXE_VM_DIR/initramfs.cpio.gz ]] || build_initramfs
  flock -u "$lockfd"
}

# Stage 2, PID 1 in the overlay root (busybox sh): the rxe device, then the command.
write_stage2() {
  cat >"$1/stage2" <<'EOF'
BB=/run/rxevm-init/busybox
R=/run/rxevm
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
. $R/params
finish() { echo "$1" > $R/rc; $BB sync; echo "rxe-vm: poweroff rc=$1 uptime=$($BB cut -d' ' -f1 /proc/uptime)"; $BB poweroff -f; }
step() { echo "rxe-vm: + $*"; "$@" || { echo "rxe-vm: FAILED: $*"; finish 125; }; }
$BB mkdir -p /dev/pts /dev/shm
$BB mount -t devpts devpts /dev/pts; $BB mount -t tmpfs shm /dev/shm
$BB hostname rxe-vm
KV=$($BB uname -r)
$BB mkdir -p /lib/modules; $BB rm -rf /lib/modules/$KV; $BB ln -s "$KMODDIR" /lib/modules/$KV
step ip link set lo up
step modprobe -a crc32_generic rdma_rxe rdma_ucm dummy
step ip link add rxenet0 type dummy
step ip link set rxenet0 mtu "$MTU"
step ip link set rxenet0 up
step ip addr add "$IPV4/24" dev rxenet0
step rdma link add rxe0 type rxe netdev rxenet0
# The IPv4-mapped GID appears once the address is up.
n=0; while [ $n -lt 50 ] && ! $BB grep -q "ffff:" /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null; do $BB usleep 100000; n=$((n+1)); done
rdma link show
OUT=; ERR=
for p in /sys/class/virtio-ports/*; do
  case "$($BB cat $p/name 2>/dev/null)" in
    rxevm.out) OUT=/dev/${p##*/};; rxevm.err) ERR=/dev/${p##*/};;
  esac
done
[ -n "$OUT" ] && [ -n "$ERR" ] || { echo "rxe-vm: virtio ports missing"; finish 125; }
echo "rxe-vm: set up at uptime $($BB cut -d' ' -f1 /proc/uptime); running the command"
ulimit -l unlimited
ulimit -n 65536
/bin/bash $R/cmd.sh </dev/null >"$OUT" 2>"$ERR"
rc=$?
echo "rxe-vm: command exited $rc at uptime $($BB cut -d' ' -f1 /proc/uptime)"
finish $rc
EOF
}

run_vm() {
  [[ -f $RXE_VM_DIR/initramfs.cpio.gz && -d $RXE_VM_DIR/kroot ]] || setup
  check_packages
  local accel=$RXE_VM_ACCEL cpu
  if [[ $accel == auto ]]; then
    accel=tcg
    if [[ -w /dev/kvm ]] && { [[ -d /sys/module/kvm_intel ]] || [[ -d /sys/module/kvm_amd ]]; }; then
      accel=kvm
    fi
  fi
  if [[ $accel == kvm ]]; then cpu=host; else cpu=max; fi

  local kernel kv run share
  kernel=$RXE_VM_DIR/vmlinux
  [[ -s $kernel ]] || kernel=$(ls "$RXE_VM_DIR"/kroot/boot/vmlinuz-* | head -1)
  kv=$(ls "$RXE_VM_DIR/kroot/lib/modules")
  mkdir -p "$RXE_VM_DIR/runs"
  run=$(mktemp -d "$RXE_VM_DIR/runs/run.XXXXXX")
  [[ $RXE_VM_KEEP == 1 ]] || trap 'rm -rf "$run"' EXIT
  share=$run/share
  mkdir -p "$share"
  write_stage2 "$share"
  {
    printf 'KMODDIR=%q\n' "$RXE_VM_DIR/kroot/lib/modules/$kv"
    printf 'IPV4=%q\n' "$RXE_VM_IPV4"
    printf 'MTU=%q\n' "$RXE_VM_MTU"
  } >"$share/params"
  {
    echo '#!/bin/bash'
    export -p | grep -vE '^declare -[a-z]*r|^declare -x (BASH_[A-Z_]*|SHLVL|_|OLDPWD|PWD)=' || true
    printf 'cd -- %q || exit 125\n' "$PWD"
    printf 'exec'
    printf ' %q' "$@"
    printf '\n'
  } >"$share/cmd.sh"

  local -a rwargs=()
  local i=0 d
  if [[ -n $RXE_VM_RW ]]; then
    local -a dirs
    IFS=: read -ra dirs <<<"$RXE_VM_RW"
    for d in "${dirs[@]}"; do
      [[ -z $d ]] && continue
      d=$(realpath -e -- "$d")
      echo "$d" >>"$share/rwpaths"
      rwargs+=(-virtfs "local,path=$d,mount_tag=rw$i,security_model=none,multidevs=remap")
      i=$((i + 1))
    done
  fi

  # qemu writes CMD's stdout and stderr into FIFOs that cat relays live. This shell holds each
  # FIFO open read-write so neither side blocks in open() if qemu dies early; closing them after
  # qemu exits gives cat EOF. If our stdout goes away (`| head`), a second cat drains the FIFO
  # so that qemu never blocks on a full one.
  mkfifo "$run/out.fifo" "$run/err.fifo"
  (cat "$run/out.fifo" || exec cat "$run/out.fifo" >/dev/null) &
  local catout=$!
  (cat "$run/err.fifo" >&2 || exec cat "$run/err.fifo" >/dev/null) &
  local caterr=$!
  local ofd efd
  exec {ofd}<>"$run/out.fifo" {efd}<>"$run/err.fifo"

  local qrc=0
  timeout -k 10 "$RXE_VM_TIMEOUT" qemu-system-x86_64 \
    -accel "$accel" -cpu "$cpu" -M q35 -smp "$RXE_VM_SMP" -m "$RXE_VM_MEM" \
    -nodefaults -display none -no-reboot \
    -kernel "$kernel" -initrd "$RXE_VM_DIR/initramfs.cpio.gz" \
    -append "console=ttyS0 quiet loglevel=4 panic=-1 oops=panic mitigations=off tsc=reliable no_timer_check rodata=off cryptomgr.notests ${RXE_VM_APPEND:-}" \
    -serial "file:$run/console.log" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$share,mount_tag=rxevm,security_model=none" \
    "${rwargs[@]}" ${RXE_VM_QEMU_ARGS:-} \
    -device virtio-serial-pci \
    -chardev "file,id=out,path=$run/out.fifo" -device virtserialport,chardev=out,name=rxevm.out \
    -chardev "file,id=err,path=$run/err.fifo" -device virtserialport,chardev=err,name=rxevm.err \
    </dev/null >"$run/qemu.log" 2>&1 {ofd}>&- {efd}>&- || qrc=$?
  exec {ofd}>&- {efd}>&-
  wait "$catout" "$caterr" 2>/dev/null || true

  local rc
  if [[ -s $share/rc ]]; then
    rc=$(cat "$share/rc")
  elif ((qrc == 124)); then
    log "timed out after ${RXE_VM_TIMEOUT} s"
    rc=124
  else
    log "the VM failed before the command finished (qemu exit $qrc); console log:"
    tail -n 40 "$run/console.log" >&2 || true
    cat "$run/qemu.log" >&2 || true
    rc=125
  fi
  if [[ $RXE_VM_VERBOSE == 1 ]]; then
    { echo "---- guest console ($accel) ----"; cat "$run/console.log" "$run/qemu.log"; } >&2
  fi
  [[ $RXE_VM_KEEP == 1 ]] && log "run folder kept: $run"
  exit "$rc"  # here, while $run is in scope for the EXIT trap
}

case "${1:-}" in
  --setup)
    shift
    setup
    [[ $# -eq 0 ]] && exit 0
    ;;
esac
[[ ${1:-} == -- ]] && shift
if (($# == 0)); then
  sed -n '2,/^set -euo/{/^#/p}' "$0" >&2
  exit 2
fi
run_vm "$@"
