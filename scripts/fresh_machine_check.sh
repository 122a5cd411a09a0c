#!/usr/bin/env bash
# The README's quick start and the Debian package on a fresh machine: a minimal Debian 12 root
# made by debootstrap from Debian's archive (nothing of this machine's packages in it), run in a
# chroot as root.
#   1. a clean clone of this repository's HEAD in the root, and the quick start's first command
#      as the README writes it: `bash scripts/run.sh` (setup.sh installs what it needs, then it
#      builds, converts Fashion-MNIST and trains LeNet); with --test the second too,
#      `bash scripts/test.sh` (slow: the whole suite);
#   2. the package `cpack -G DEB` makes from this machine's build/ installed with apt into a second
#      copy of the pristine root, and its troupe run (`troupe info`, and a short training run).
# Needs root (debootstrap, chroot, mounts) and Debian's archive; makes its roots under --root
# (default /var/tmp/troupe-fresh, removed first) and unmounts them at the end, also on an error.
#   sudo bash scripts/fresh_machine_check.sh [--root DIR] [--test] [--skip-quickstart]
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
root=/var/tmp/troupe-fresh
run_tests=false
quickstart=true
while (($#)); do
  case "$1" in
    --root) root=$2; shift 2 ;;
    --test) run_tests=true; shift ;;
    --skip-quickstart) quickstart=false; shift ;;
    *) echo "fresh_machine_check: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "fresh_machine_check: run it as root (chroot, mounts)" >&2; exit 2; }
command -v debootstrap > /dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap

# Every mount under the roots, deepest first: ours, and what the tests mounted in the chroot.
unmount_all() {
  awk -v r="$root/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r target; do umount -l "$target" 2> /dev/null || true; done
}
trap unmount_all EXIT
# Makes root $1 a machine to chroot into, as a booted one is: a mount point of its own (so that
# the tests' mount namespaces can make / a slave), the running kernel's proc, sys (with its cgroup
# mount, for slurmd) and dev, a tmpfs on /run, and this machine's name and resolver (/etc/hosts
# names it, as Debian's installer writes it; Slurm's node names must resolve).
enter() {
  mount --bind "$1" "$1"
  mount -t proc proc "$1/proc"
  for fs in sys dev; do
    mkdir -p "$1/$fs"
    mount --rbind "/$fs" "$1/$fs"
    mount --make-rslave "$1/$fs"
  done
  mount -t tmpfs tmpfs "$1/run"
  cp /etc/resolv.conf /etc/hosts /etc/hostname "$1/etc/"
}
step() { echo "== $(date +%T) $*"; }

# A root left by an earlier run that was killed may still have mounts: never remove through them.
if [[ -d "$root" ]]; then
  unmount_all
  rm -rf --one-file-system "$root"
fi
mkdir -p "$root"
step "debootstrap --variant=minbase bookworm (Debian's archive)"
debootstrap --variant=minbase bookworm "$root/pristine" http://deb.debian.org/debian > "$root/debootstrap.log" 2>&1 ||
  { tail -20 "$root/debootstrap.log"; exit 1; }
cp -a "$root/pristine" "$root/package"

if $quickstart; then
  step "a clean clone of HEAD, and the quick start as the README writes it"
  fresh="$root/pristine"
  enter "$fresh"
  git clone -q "$here" "$fresh/root/troupe"
  chroot "$fresh" /bin/bash -c "apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends git ca-certificates sudo > /dev/null"
  chroot "$fresh" /bin/bash -c "cd /root/troupe && bash scripts/run.sh" 2>&1 | tee "$root/run.log" |
    grep -E "^setup:|epoch [0-9]+ done|done:|error" || true
  grep -q "done: .* final test_accuracy" "$root/run.log" ||
    { tail -30 "$root/run.log"; echo "the quick start's first command failed"; exit 1; }
  if $run_tests; then
    step "the quick start's second command: bash scripts/test.sh"
    chroot "$fresh" /bin/bash -c "cd /root/troupe && CI=true bash scripts/test.sh" > "$root/test.log" 2>&1 ||
      { tail -40 "$root/test.log"; echo "the suite failed"; exit 1; }
    grep -E "tests passed|tests failed" "$root/test.log"
  fi
fi

step "the Debian package from $here/build, installed with apt into a fresh root"
pkgdir=$(mktemp -d)
cpack -G DEB --config "$here/build/CPackConfig.cmake" -B "$pkgdir" > "$pkgdir/cpack.log" 2>&1 ||
  { cat "$pkgdir/cpack.log"; exit 1; }
deb=$(ls "$pkgdir"/troupe_*_amd64.deb)
cp "$deb" "$root/package/root/"
enter "$root/package"
chroot "$root/package" /bin/bash -c "apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q /root/$(basename "$deb")" > "$root/package.log" 2>&1 ||
  { tail -30 "$root/package.log"; echo "apt could not install $(basename "$deb")"; exit 1; }
grep -E "^Setting up troupe|newly installed" "$root/package.log"
chroot "$root/package" troupe info > "$root/info.txt" 2>&1 || { cat "$root/info.txt"; exit 1; }
head -5 "$root/info.txt"
mkdir -p "$root/package/root/data"
cp -r "$here/build/testdata/lmdb" "$root/package/root/data/"
cp "$here/configs/mlp.toml" "$root/package/root/"
chroot "$root/package" /bin/bash -c "cd /root && troupe train mlp.toml --train_data data/lmdb/train \
  --test_data data/lmdb/test --num_epochs 1 --epoch_size 6400 --log_every 0" 2>&1 |
  grep -E "done:|error" | tail -2
rm -rf "$pkgdir"
step "fresh machine check: passed"
