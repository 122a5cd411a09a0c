#!/usr/bin/env bash
# N "hosts" on this one machine, for tests and benchmarks that need real multi-host behaviour.
#
# Each host is a network namespace PREFIX-hostI whose interface eth0 (a veth pair; the other end,
# PREFIXvI, is a port of the bridge PREFIXbr0) has the address SUBNET.(I+2)/24, with loopback up
# and IPv6 off; and a mount and UTS namespace of its own (private tmpfs /tmp and /dev/shm, hostname
# hostI), held by one long-lived process: that host's sshd (Debian's /usr/sbin/sshd), listening
# on SUBNET.(I+2):22, root login by key only, with host and user keys made here. Processes on
# different hosts can meet only over TCP on the bridge: the root namespace has no address on it
# (unless --gateway), so nothing leaves the machine and nothing outside reaches in.
# Everything else stays shared: /work, /usr, /run. The state folder lives in /run so that every
# host can read the ssh key (treat it as read-only from the hosts); its subfolder shared/ is the
# one place meant for files every host sees at one path, as a cluster's shared storage (NFS) would
# be: checkpoints that a restarted process on another host must read, say.
#
# Usage (as root; PREFIX defaults to $TROUPE_HOSTS_PREFIX, else "tr"):
#   hosts.sh up N [--prefix P] [--subnet A.B.C] [--gateway] [--owner PID] [--keep DIR]...
#       Makes hosts 0..N-1 and returns once each one's sshd lets host 0 in by ssh; prints one
#       line per host, "host I ADDRESS NETNS SSHD_PID". Fails (exit 1, naming what is missing or
#       what failed, with the sshd log) and leaves nothing behind if any step fails. Fails when an
#       instance of that prefix exists already (run `down` first). --owner: the process the
#       instance belongs to (`gc` removes it once that process is gone); default: none.
#       --keep DIR: a folder that every host sees at its own path, read-only, although it lies
#       under /tmp or /dev/shm (a checkout and its build in /tmp/x, say, whose binaries the hosts
#       run); one that lies elsewhere is seen as it is anyway. This script's own checkout is kept.
#   hosts.sh down [--prefix P]
#       Kills every process of the instance's hosts and relays and removes its namespaces,
#       links, bridge and state folder. Idempotent: works on a half-made instance, after a crash,
#       without the state folder (it finds what to remove by name), and when nothing is left.
#   hosts.sh gc
#       `down` for every instance whose --owner process is gone.
#   hosts.sh exec I [--prefix P] [--cwd DIR] [--] CMD...
#       Runs CMD in host I's namespaces (network, mount, UTS; nsenter into its sshd), in DIR
#       (default /), with the caller's environment; exits with CMD's code.
#   hosts.sh addr I | ns I | pid I | root I | dir | shared | ssh-opts   [--prefix P]
#       Host I's address, network namespace, sshd pid, its root as seen from here
#       (/proc/PID/root: host I's private /tmp is ROOT/tmp), the state folder, the shared folder,
#       and the ssh client options that log in to any host ("-i KEY -oUserKnownHostsFile=...").
#   hosts.sh shape I [rate R] [delay D] [loss L%] [--emulator auto|netem|relay]   [--prefix P]
#   hosts.sh shape I clear [--prefix P]
#       Shapes what host I sends (egress of its eth0; replaces earlier shaping of host I): rate by
#       `tc qdisc tbf` (e.g. 1gbit, 10gbit, 100mbit), delay (e.g. 100ms, 1s) and loss (e.g. 1%)
#       by `tc qdisc netem` where the kernel has it, else by this script's userspace relay: the
#       frames host I sends are redirected (tc mirred, on the bridge side of its veth) to a tap
#       that a python3 process reads, drops with probability L, holds for D and writes into the
#       bridge. $TROUPE_HOSTS_EMULATOR or --emulator picks one (auto: netem if the kernel has it);
#       a named one that is not available fails. Prints "host I: ... by EMULATOR".
#   hosts.sh link I down|up [--prefix P]
#       Takes host I's link down (its bridge-side end: eth0 loses carrier, its packets go
#       nowhere, like a pulled cable; its address stays) or up again.
#   hosts.sh ps I [--prefix P]
#       One line per live process of host I (its sshd too; zombies left out): "PID COMMAND".
#   hosts.sh kill I [--prefix P]
#       Kills (SIGKILL) every process of host I but its sshd, waiting up to 10 s until they are
#       gone (fails naming the ones left): a host that crashed and came back at once.
#   hosts.sh clean I [--prefix P]
#       Empties host I's /tmp and /dev/shm, all but the kept folders (--keep) and the folders
#       that lead to them.
set -Eeuo pipefail
trap 'echo "hosts.sh: line $LINENO failed (exit $?): $BASH_COMMAND" >&2' ERR

readonly STATE_ROOT="${TROUPE_HOSTS_STATE:-/run/troupe-hosts}"
prefix="${TROUPE_HOSTS_PREFIX:-tr}"

die() {
  echo "hosts.sh: $*" >&2
  exit 1
}

need() {  # need TOOL PACKAGE
  command -v "$1" >/dev/null 2>&1 || die "$1 is missing: install the Debian package $2"
}

check_prefix() {
  [[ "$prefix" =~ ^[a-z][a-z0-9]{0,9}$ ]] ||
    die "bad prefix '$prefix': 1 to 10 of [a-z0-9], starting with a letter"
}

state() { echo "$STATE_ROOT/$prefix"; }
netns_of() { echo "$prefix-host$1"; }
bridge() { echo "${prefix}br0"; }
veth_of() { echo "${prefix}v$1"; }  # the bridge side; the host side is eth0 in its netns
tap_of() { echo "${prefix}d$1"; }   # the relay's tap

load() {  # reads the instance's state; fails naming the prefix when there is none
  [[ -f "$(state)/instance" ]] || die "no hosts with prefix '$prefix' (hosts.sh up N --prefix $prefix)"
  # shellcheck disable=SC1091
  source "$(state)/instance"
}

check_index() {
  if ! [[ "$1" =~ ^[0-9]+$ ]] || ((10#$1 >= n)); then
    die "no host '$1' (hosts 0..$((n - 1)) of prefix $prefix)"
  fi
}

addr_of() { echo "$subnet.$(($1 + 2))"; }

sshd_pid() {  # the live sshd of host I, or a failure naming it
  local pid
  pid="$(cat "$(state)/host$1.pid" 2>/dev/null || true)"
  [[ -n "$pid" && "$(cat "/proc/$pid/comm" 2>/dev/null)" == sshd ]] ||
    die "host $1 (prefix $prefix) has no running sshd; its log:
$(tail -20 "$(state)/host$1.log" 2>/dev/null)"
  echo "$pid"
}

# No ConnectTimeout: ssh keeps the first value of an option, so a caller's own comes after these.
ssh_opts() {
  echo "-i $(state)/user_key -oUserKnownHostsFile=/dev/null -oStrictHostKeyChecking=no" \
    "-oBatchMode=yes -oLogLevel=ERROR"
}

# --- teardown ----------------------------------------------------------------------------------

# Processes whose command line holds "troupe-hosts-relay PREFIX " (found without the state
# folder too).
relay_pids() {
  local f pid
  while read -r f; do
    pid="${f#/proc/}"
    pid="${pid%/cmdline}"
    if tr '\0' ' ' 2>/dev/null <"$f" | grep -- "troupe-hosts-rela[y] $prefix " > /dev/null; then
      echo "$pid"
    fi
  done < <(grep -a -l -F troupe-hosts-relay /proc/[0-9]*/cmdline 2>/dev/null || true)
}

# Waits up to 10 s for the processes in $@ to be gone (zombies count as gone).
wait_gone() {
  local left p i
  for ((i = 0; i < 100; ++i)); do
    left=()
    for p in "$@"; do
      if [[ -e "/proc/$p" ]] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; then
        left+=("$p")
      fi
    done
    ((${#left[@]} == 0)) && return 0
    sleep 0.1
  done
  echo "${left[*]}"
  return 1
}

cmd_down() {
  check_prefix
  local pids=() ns p link left
  mapfile -t pids < <(relay_pids)
  while read -r ns _; do
    [[ "$ns" =~ ^$prefix-host[0-9]+$ ]] || continue
    mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$ns" 2>/dev/null || true)
  done < <(ip netns list 2>/dev/null)
  for p in "${pids[@]}"; do
    kill -KILL "$p" 2>/dev/null || true
  done
  if ((${#pids[@]})) && ! left="$(wait_gone "${pids[@]}")"; then
    echo "hosts.sh: warning: processes $left of prefix $prefix did not die" >&2
  fi
  while read -r ns _; do
    if [[ "$ns" =~ ^$prefix-host[0-9]+$ ]]; then ip netns del "$ns" 2>/dev/null || true; fi
  done < <(ip netns list 2>/dev/null)
  # A namespace that an orphaned socket keeps alive keeps its veth pair: delete them by name.
  while read -r link; do
    if [[ "$link" =~ ^($prefix(v|d)[0-9]+|${prefix}br0)$ ]]; then
      ip link del "$link" 2>/dev/null || true
    fi
  done < <(ip -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }')
  rm -rf "$(state)"
  left="$(ip netns list | grep -E "^$prefix-host[0-9]+( |$)" || true)"
  left+="$(ip -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' |
    grep -E "^($prefix(v|d)[0-9]+|${prefix}br0)$" || true)"
  [[ -z "$left" ]] || die "down: could not remove $(echo "$left" | tr '\n' ' ')"
}

# A process's start time (clock ticks since boot): with its pid, it names the process for good.
start_time() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"  # the command name, in parentheses, may hold spaces
  awk '{ print $20 }' <<<"$stat"
}

owner_alive() {  # owner_alive "PID:STARTTIME"
  [[ "$(start_time "${1%%:*}" || true)" == "${1#*:}" ]]
}

cmd_gc() {
  local dir owner
  for dir in "$STATE_ROOT"/*/; do
    [[ -f "$dir/instance" ]] || continue
    # (Its owner may take it down meanwhile: a test beside this one, ending.)
    owner="$(sed -n 's/^owner=//p' "$dir/instance" 2>/dev/null)" || continue
    [[ -n "$owner" ]] || continue
    if ! owner_alive "$owner"; then
      prefix="$(basename "$dir")"
      echo "hosts.sh: removing hosts of prefix $prefix: their owner ${owner%%:*} is gone" >&2
      cmd_down
    fi
  done
}

# --- bring-up ----------------------------------------------------------------------------------

write_sshd_config() {  # write_sshd_config I
  local dir
  dir="$(state)"
  cat >"$dir/host$1.sshd_config" <<EOF
ListenAddress $(addr_of "$1"):22
HostKey $dir/host_key
AuthorizedKeysFile $dir/authorized_keys
PidFile $dir/host$1.pid
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
MaxStartups 200
MaxSessions 200
LogLevel INFO
EOF
}

start_host() {  # start_host I
  local i="$1" ns addr dir
  ns="$(netns_of "$i")"
  addr="$(addr_of "$i")"
  dir="$(state)"
  ip netns add "$ns"
  ip link add "$(veth_of "$i")" type veth peer name "${prefix}e$i"
  ip link set "${prefix}e$i" netns "$ns"
  ip -n "$ns" link set "${prefix}e$i" name eth0
  ip link set "$(veth_of "$i")" master "$(bridge)" up
  ip -n "$ns" link set lo up
  ip netns exec "$ns" sh -c "for f in /proc/sys/net/ipv6/conf/*/disable_ipv6; do echo 1 > \$f; done"
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  write_sshd_config "$i"
  # A kept folder under the private /tmp or /dev/shm: bound aside before they are mounted, moved
  # back to its path after, and made read-only there (so that nothing a host does removes it).
  local aside="" back="" k=0 path
  for path in "${kept[@]+"${kept[@]}"}"; do
    mkdir -p "$dir/keep$i.$k"
    aside+="mount --rbind '$path' '$dir/keep$i.$k' && "
    back+="mkdir -p '$path' && mount --move '$dir/keep$i.$k' '$path' && "
    back+="mount -o remount,bind,ro '$path' && "
    k=$((k + 1))
  done
  # One process holds the host's mount and UTS namespaces: its sshd (exec'd, so the pid file
  # names it). Everything that logs in, or enters by nsenter, shares them.
  setsid ip netns exec "$ns" unshare --mount --uts --propagation private sh -c "
    $aside
    mount -t tmpfs -o mode=1777 tmpfs /tmp &&
    mount -t tmpfs -o mode=1777 tmpfs /dev/shm &&
    $back
    hostname host$i &&
    exec /usr/sbin/sshd -D -e -f $dir/host$i.sshd_config" </dev/null >>"$dir/host$i.log" 2>&1 &
  disown
}

# The folders of $@ that lie under /tmp or /dev/shm, as absolute paths without links, in `kept`
# (global), leaving out one inside another. This script's checkout is always among them.
keep_folders() {
  local path real k
  kept=()
  for path in "$@" "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.."; do
    real="$(readlink -f "$path")" && [[ -d "$real" ]] || die "--keep $path: no such folder"
    [[ "$real" =~ ^/(tmp|dev/shm)/ ]] || continue
    [[ "$real" =~ [\'\ ] ]] && die "--keep $path: a folder whose name has a quote or a space"
    for k in "${!kept[@]}"; do
      [[ "$real/" == "${kept[$k]}/"* ]] && continue 2
      [[ "${kept[$k]}/" == "$real/"* ]] && unset 'kept[k]'
    done
    kept+=("$real")
  done
  kept=("${kept[@]+"${kept[@]}"}")
}

wait_host() {  # wait_host I: until its sshd accepts TCP connections, 10 s at most
  local i="$1" k pid=""
  for ((k = 0; k < 100; ++k)); do
    pid="$(cat "$(state)/host$i.pid" 2>/dev/null || true)"
    if [[ -n "$pid" ]] && nsenter -t "$pid" -n bash -c "exec 3<>/dev/tcp/$(addr_of "$i")/22" \
      2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  die "host $i's sshd did not accept connections on $(addr_of "$i"):22 within 10 s; its log:
$(tail -20 "$(state)/host$i.log" 2>/dev/null)"
}

cmd_up() {
  local count="$1" gateway="$2" owner="$3" i dir
  shift 3
  check_prefix
  keep_folders "$@"
  if ! [[ "$count" =~ ^[1-9][0-9]*$ ]] || ((count > 200)); then
    die "up: want a host count of 1..200, got '$count'"
  fi
  [[ "$subnet" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "bad --subnet '$subnet': want A.B.C"
  ((EUID == 0)) || die "must run as root (network namespaces, bridges, mounts)"
  need ip iproute2
  need tc iproute2
  need unshare util-linux
  need nsenter util-linux
  need setsid util-linux
  need ssh-keygen openssh-client
  need ssh openssh-client
  [[ -x /usr/sbin/sshd ]] || die "/usr/sbin/sshd is missing: install the Debian package openssh-server"
  if [[ -d "$(state)" ]] || ip link show "$(bridge)" >/dev/null 2>&1 ||
    ip netns list | grep "^$prefix-host[0-9]" > /dev/null; then
    die "hosts of prefix '$prefix' exist already (a crashed run?): hosts.sh down --prefix $prefix"
  fi
  if ((gateway)) && ip -4 route show | grep "^$subnet\.0/24" > /dev/null; then
    die "--gateway: $subnet.0/24 is routed here already: pick another --subnet"
  fi
  dir="$(state)"
  up_made=0  # global: the EXIT trap reads it after this function returned
  trap 'if ((!up_made)); then echo "hosts.sh: up failed; removing what it made" >&2; cmd_down; fi' EXIT
  mkdir -p "$dir/shared" /run/sshd  # /run/sshd: sshd's privilege separation folder
  n="$count"
  local owner_id=""
  if [[ -n "$owner" ]]; then
    owner_id="$owner:$(start_time "$owner")" || die "--owner $owner: no such process"
  fi
  printf 'n=%s\nsubnet=%s\nowner=%s\nkept=(%s)\n' "$count" "$subnet" "$owner_id" \
    "$(printf "'%s' " "${kept[@]+"${kept[@]}"}")" >"$dir/instance"
  ssh-keygen -q -t ed25519 -N '' -C troupe-hosts -f "$dir/host_key"
  ssh-keygen -q -t ed25519 -N '' -C troupe-hosts -f "$dir/user_key"
  cp "$dir/user_key.pub" "$dir/authorized_keys"
  ip link add "$(bridge)" type bridge
  ip link set "$(bridge)" up
  if ((gateway)); then ip addr add "$subnet.1/24" dev "$(bridge)"; fi
  for ((i = 0; i < count; ++i)); do start_host "$i"; done
  for ((i = 0; i < count; ++i)); do wait_host "$i"; done
  # Every host lets host 0 in by ssh, with the key: what launchers will do.
  local pid0
  pid0="$(sshd_pid 0)"
  for ((i = 0; i < count; ++i)); do
    # shellcheck disable=SC2046
    if ! out="$(nsenter -t "$pid0" -n -m -u ssh -oConnectTimeout=5 $(ssh_opts) \
      "root@$(addr_of "$i")" true 2>&1)"; then
      echo "hosts.sh: host 0 cannot log in to host $i by ssh: $out" >&2
      tail -20 "$dir/host$i.log" >&2
      false
    fi
  done
  # shellcheck disable=SC2034  # read by the EXIT trap
  up_made=1
  for ((i = 0; i < count; ++i)); do
    echo "host $i $(addr_of "$i") $(netns_of "$i") $(sshd_pid "$i")"
  done
}

# --- shaping -----------------------------------------------------------------------------------

# The userspace delay/loss line (python3, standard library only). Reads the frames of a tap,
# drops each with probability LOSS, holds the rest for DELAY seconds in order, then sends them
# into the bridge through a packet socket. argv: marker prefix tap bridge delay_s loss.
read -r -d '' RELAY_PY <<'EOF' || true
import collections, fcntl, os, random, select, socket, struct, subprocess, sys, time
_, _, _, tap, bridge, delay, loss = sys.argv
delay, loss = float(delay), float(loss)
fd = os.open("/dev/net/tun", os.O_RDWR)
fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH", tap.encode(), 0x0002 | 0x1000))  # TUNSETIFF TAP NO_PI
subprocess.run(["ip", "link", "set", tap, "up"], check=True)
out = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
out.bind((bridge, 0))
os.set_blocking(fd, False)
queue = collections.deque()
print("ready", flush=True)
while True:
    timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else None
    if select.select([fd], [], [], timeout)[0]:
        while True:
            try:
                frame = os.read(fd, 65536)
            except BlockingIOError:
                break
            if random.random() >= loss:
                queue.append((time.monotonic() + delay, frame))
    now = time.monotonic()
    while queue and queue[0][0] <= now:
        try:
            out.send(queue.popleft()[1])
        except OSError:
            pass  # the bridge side is down: the frame is lost, as on a wire
EOF

netem_available() {  # probes once per instance, on host 0's loopback
  local dir
  dir="$(state)"
  if [[ ! -f "$dir/netem" ]]; then
    if ip netns exec "$(netns_of 0)" tc qdisc add dev lo root netem delay 0ms 2>/dev/null; then
      ip netns exec "$(netns_of 0)" tc qdisc del dev lo root
      echo yes >"$dir/netem"
    else
      echo no >"$dir/netem"
    fi
  fi
  [[ "$(cat "$dir/netem")" == yes ]]
}

stop_relay() {  # stop_relay I
  local i="$1" dir pid
  dir="$(state)"
  tc qdisc del dev "$(veth_of "$i")" ingress 2>/dev/null || true
  pid="$(cat "$dir/relay$i.pid" 2>/dev/null || true)"
  if [[ -n "$pid" ]] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" |
    grep -q -- "troupe-hosts-relay $prefix "; then
    kill -KILL "$pid"
    wait_gone "$pid" >/dev/null || die "the relay of host $i (pid $pid) did not die"
  fi
  rm -f "$dir/relay$i.pid" "$dir/relay$i.log"
}

start_relay() {  # start_relay I DELAY_S LOSS
  local i="$1" dir k
  dir="$(state)"
  need python3 python3
  setsid python3 -c "$RELAY_PY" troupe-hosts-relay "$prefix" "$(tap_of "$i")" "$(bridge)" \
    "$2" "$3" </dev/null >"$dir/relay$i.log" 2>&1 &
  echo $! >"$dir/relay$i.pid"
  disown
  for ((k = 0; k < 100; ++k)); do
    grep -q '^ready$' "$dir/relay$i.log" 2>/dev/null && break
    [[ -e "/proc/$!" ]] || die "the relay of host $i failed: $(cat "$dir/relay$i.log")"
    sleep 0.1
  done
  grep -q '^ready$' "$dir/relay$i.log" ||
    die "the relay of host $i was not ready within 10 s: $(cat "$dir/relay$i.log")"
  tc qdisc add dev "$(veth_of "$i")" ingress
  tc filter add dev "$(veth_of "$i")" parent ffff: protocol all u32 match u32 0 0 \
    action mirred egress redirect dev "$(tap_of "$i")"
}

to_seconds() {  # 100ms, 1.5s, 250us -> seconds
  local v="$1"
  [[ "$v" =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ ]] || die "bad delay '$v': want e.g. 100ms or 1s"
  case "${BASH_REMATCH[3]}" in
    us) awk -v x="${BASH_REMATCH[1]}" 'BEGIN { printf "%.6f", x / 1e6 }' ;;
    ms) awk -v x="${BASH_REMATCH[1]}" 'BEGIN { printf "%.6f", x / 1e3 }' ;;
    s) echo "${BASH_REMATCH[1]}" ;;
  esac
}

rate_bytes() {  # 1gbit, 10gbit, 100mbit, 500kbit -> bytes per second
  [[ "$1" =~ ^([0-9]+)(k|m|g)bit$ ]] || die "bad rate '$1': want e.g. 1gbit, 10gbit or 100mbit"
  local mult=1000
  [[ "${BASH_REMATCH[2]}" == m ]] && mult=1000000
  [[ "${BASH_REMATCH[2]}" == g ]] && mult=1000000000
  echo $((BASH_REMATCH[1] * mult / 8))
}

cmd_shape() {
  local i="$1"
  shift
  local rate="" delay="" loss="" emulator="${TROUPE_HOSTS_EMULATOR:-auto}" clear=0
  while (($#)); do
    case "$1" in
      rate) rate="$2"; shift 2 ;;
      delay) delay="$2"; shift 2 ;;
      loss) loss="${2%\%}"; shift 2 ;;
      clear) clear=1; shift ;;
      --emulator) emulator="$2"; shift 2 ;;
      *) die "shape: unknown word '$1' (rate R, delay D, loss L%, clear, --emulator E)" ;;
    esac
  done
  [[ -z "$loss" || "$loss" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "bad loss '$loss': want e.g. 1%"
  [[ "$emulator" =~ ^(auto|netem|relay)$ ]] || die "bad emulator '$emulator': auto, netem or relay"
  local ns
  ns="$(netns_of "$i")"
  ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
  stop_relay "$i"
  if ((clear)); then
    echo "host $i: shaping cleared"
    return
  fi
  [[ -n "$rate$delay$loss" ]] || die "shape: say rate, delay or loss (or clear)"
  local burst=0
  if [[ -n "$rate" ]]; then
    burst="$(rate_bytes "$rate")"
    burst=$((burst / 250 > 65536 ? burst / 250 : 65536))  # 4 ms of the rate, 64 KiB at least
  fi
  local used="tbf"
  if [[ -n "$delay$loss" ]]; then
    if [[ "$emulator" == netem ]] && ! netem_available; then
      die "shape --emulator netem: this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM)"
    fi
    if [[ "$emulator" != relay ]] && netem_available; then
      used="netem"
      local args=()
      [[ -n "$delay" ]] && args+=(delay "$delay")
      [[ -n "$loss" ]] && args+=(loss "$loss%")
      ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: netem "${args[@]}"
      if [[ -n "$rate" ]]; then
        used="netem+tbf"
        ip netns exec "$ns" tc qdisc add dev eth0 parent 1:1 handle 10: tbf rate "$rate" \
          burst "$burst" latency 100ms
      fi
    else
      used="relay"
      start_relay "$i" "$(to_seconds "${delay:-0s}")" \
        "$(awk -v x="${loss:-0}" 'BEGIN { printf "%.6f", x / 100 }')"
    fi
  fi
  if [[ -n "$rate" && "$used" != netem+tbf ]]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
    [[ "$used" == relay ]] && used="relay+tbf"
  fi
  local how="by $used"
  [[ "$used" == relay* ]] && how="$how (userspace; $(netem_available && echo forced || echo 'this kernel has no netem'))"
  echo "host $i:${rate:+ rate $rate}${delay:+ delay $delay}${loss:+ loss $loss%} $how"
}

cmd_link() {
  local i="$1" dir="${2:-}"
  [[ "$dir" == up || "$dir" == down ]] || die "link: want 'link I down' or 'link I up'"
  ip link set "$(veth_of "$i")" "$dir"
}

cmd_ps() {
  local p comm
  for p in $(ip netns pids "$(netns_of "$1")"); do
    grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null && continue
    # One that ended since the list was made is left out (and fails nothing, were it the last).
    if comm="$(cat "/proc/$p/comm" 2>/dev/null)"; then echo "$p $comm"; fi
  done
}

cmd_kill() {
  local i="$1" keep p pids=() left
  keep="$(sshd_pid "$i")"
  for p in $(ip netns pids "$(netns_of "$i")"); do
    [[ "$p" == "$keep" ]] || pids+=("$p")
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if ((${#pids[@]})) && ! left="$(wait_gone "${pids[@]}")"; then
    die "host $i: processes $left outlived SIGKILL for 10 s"
  fi
  echo "host $i: killed ${#pids[@]} process(es)"
}

# Run inside a host by `clean`: removes what $1 holds but the folders $2... and those that lead
# to them.
read -r -d '' CLEAN_SH <<'EOF' || true
clean() {
  local entry k lead
  for entry in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    [[ -e "$entry" || -L "$entry" ]] || continue
    lead=0
    for k in "${@:2}"; do
      [[ "$entry" == "$k" ]] && continue 2
      [[ "$k" == "$entry/"* ]] && lead=1
    done
    if ((lead)); then clean "$entry" "${@:2}"; else rm -rf -- "$entry"; fi
  done
}
clean /tmp "$@" && clean /dev/shm "$@"
EOF

cmd_clean() {
  nsenter -t "$(sshd_pid "$1")" -m -- bash -c "$CLEAN_SH" clean "${kept[@]+"${kept[@]}"}" ||
    die "host $1: could not empty /tmp and /dev/shm"
}

# --- command line ------------------------------------------------------------------------------

main() {
  (($#)) || die "usage: hosts.sh up|down|gc|exec|addr|ns|pid|root|dir|shared|ssh-opts|shape|link|ps|kill|clean ... (see the top of this file)"
  local cmd="" args=() gateway=0 owner="" cwd="/" keep=()
  subnet="10.77.0"
  while (($#)); do
    case "$1" in
      --prefix) prefix="$2"; shift 2 ;;
      --subnet) subnet="$2"; shift 2 ;;
      --gateway) gateway=1; shift ;;
      --owner) owner="$2"; shift 2 ;;
      --cwd) cwd="$2"; shift 2 ;;
      --keep) keep+=("$2"); shift 2 ;;
      --) shift; args+=("$@"); break ;;
      *) if [[ -z "$cmd" ]]; then cmd="$1"; else args+=("$1"); fi; shift ;;
    esac
  done
  set -- "${args[@]+"${args[@]}"}"
  case "$cmd" in
    up) (($# == 1)) || die "usage: hosts.sh up N [--prefix P] [--subnet A.B.C] [--gateway] [--owner PID] [--keep DIR]..."
      cmd_up "$1" "$gateway" "$owner" "${keep[@]+"${keep[@]}"}" ;;
    down) cmd_down ;;
    gc) cmd_gc ;;
    dir) check_prefix; state ;;
    shared) load; echo "$(state)/shared" ;;
    ssh-opts) load; ssh_opts ;;
    addr | ns | pid | root | shape | link | ps | kill | clean | exec)
      (($# >= 1)) || die "$cmd: which host?"
      load
      check_index "$1"
      local i=$((10#$1))
      shift
      case "$cmd" in
        addr) addr_of "$i" ;;
        ns) netns_of "$i" ;;
        pid) sshd_pid "$i" ;;
        root) echo "/proc/$(sshd_pid "$i")/root" ;;
        shape) cmd_shape "$i" "$@" ;;
        link) cmd_link "$i" "$@" ;;
        ps) cmd_ps "$i" ;;
        kill) cmd_kill "$i" ;;
        clean) cmd_clean "$i" ;;
        exec)
          (($#)) || die "exec: what command?"
          local pid
          pid="$(sshd_pid "$i")"
          exec nsenter -t "$pid" -n -m -u -W "$cwd" -- "$@" ;;
      esac ;;
    *) die "unknown command '$cmd' (up, down, gc, exec, addr, ns, pid, root, dir, shared, ssh-opts, shape, link, ps, kill, clean)" ;;
  esac
}

main "$@"
