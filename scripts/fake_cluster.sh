#!/usr/bin/env bash
# fake_cluster.sh: one machine as a small cluster. Each node is a network
# namespace with one address on a bridge in the root namespace, its link
# shaped with tc; processes run on a node with `run`. Needs root.
#
#   fake_cluster.sh [--name NAME] [--net A.B.C] up N [--rate RATE] [--delay DELAY]
#   fake_cluster.sh [--name NAME] run NODE CMD [ARGS...]
#   fake_cluster.sh [--name NAME] cut NODE | heal NODE
#   fake_cluster.sh [--name NAME] status | down
#
# Node i is namespace NAME<i> with address A.B.C.(10+i)/24 on interface eth0;
# the bridge NAME-br holds A.B.C.1/24, so the root namespace reaches every
# node. NAME (default brg, 1-8 lowercase letters or digits) keeps clusters
# apart: two clusters at once need different names and different --net
# (default 10.88.0).
#
# --rate (tc's units: 100mbit, 10gbit) caps each node's link in both
# directions with htb. --delay (10ms, 50us) adds that latency each way with
# netem, which some kernels lack: `up` then stops and says so before creating
# anything.
#
# `run` replaces itself with the command (ip netns exec), so the caller's pid
# is the command's. `cut` takes the node's port off the bridge: the node
# stays up, its own link too, but nothing gets to or from the others, as if
# its cable were pulled, the partition fault; `heal` puts the port back, and
# traffic flows again at once (a link taken down and up again carries
# nothing until the kernel's link watch, up to a second later, notices:
# too late for a test of a brief cut). `down` stops every process still
# running on the nodes (TERM, then KILL), removes what `up` made (listed in
# the state file /run/brigade-fake-cluster/NAME as it is made, so a failed
# `up` is undone too) and does nothing when nothing is up.
set -euo pipefail

name=brg
net=10.88.0
state_root=/run/brigade-fake-cluster

die() {
  echo "fake_cluster.sh: $*" >&2
  exit 1
}

usage() {
  sed -n '6,9p' "$0" | sed 's/^# \{0,3\}//' >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --name)
      [[ $# -ge 2 ]] || die "--name needs a value"
      name=$2
      shift 2
      ;;
    --net)
      [[ $# -ge 2 ]] || die "--net needs a value (three octets, e.g. 10.88.0)"
      net=$2
      shift 2
      ;;
    -h | --help) usage ;;
    *) break ;;
  esac
done
[[ $# -ge 1 ]] || usage
verb=$1
shift

# No trailing digit: cluster "brg1" node 0 and cluster "brg" node 10 would
# both be namespace brg10.
[[ $name =~ ^[a-z]([a-z0-9]{0,6}[a-z])?$ ]] ||
  die "--name '$name' must be 1-8 lowercase letters or digits, starting and ending with a letter (it prefixes namespace and interface names)"
state="$state_root/$name"
bridge="$name-br"

[[ $(id -u) == 0 ]] || die "$verb needs root (network namespaces, bridges and tc): run it with sudo"
command -v ip >/dev/null || die "the ip command (iproute2) is missing: apt-get install iproute2"

ns_of() { echo "$name$1"; }
host_end_of() { echo "$name$1-h"; }

# The number of nodes of the cluster that is up, from its state file.
node_count() {
  [[ -f $state ]] || die "no cluster '$name' is up: start one with \`fake_cluster.sh --name $name up N\`"
  sed -n 's/^nodes //p' "$state"
}

check_node() {
  local count
  count=$(node_count)
  if ! [[ $1 =~ ^[0-9]+$ ]] || ((10#$1 >= count)); then
    die "cluster '$name' has nodes 0..$((count - 1)), not '$1'"
  fi
}

# Stops every process in namespace $1: TERM, then KILL for what is left after
# 5 s; returns once none is left (or after 10 s more, naming the survivors).
stop_processes() {
  local ns=$1 pids i
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [[ -n $pids ]] || return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $pids ]] || return 0
    if ((i == 50)); then
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
    fi
    sleep 0.1
  done
  echo "fake_cluster.sh: processes ${pids//$'\n'/ } in namespace $ns did not die" >&2
}

# Removes what the state file lists, last made first; tolerates what is
# already gone, so it can finish a `down` that was interrupted.
tear_down() {
  local kind object status=0
  [[ -f $state ]] || return 0
  # Processes first: a namespace with processes in it outlives `ip netns del`.
  while read -r kind object; do
    if [[ $kind == netns ]]; then stop_processes "$object"; fi
  done <"$state"
  while read -r kind object; do
    case "$kind" in
      netns)
        if ip netns list | awk '{print $1}' | grep -qx "$object"; then
          ip netns del "$object" || status=1
        fi
        ;;
      link)
        if ip link show "$object" >/dev/null 2>&1; then
          ip link del "$object" || status=1
        fi
        ;;
    esac
  done < <(tac "$state")
  ((status == 0)) || die "could not remove everything listed in $state; it is kept for another \`down\`"
  rm -f "$state"
}

# Records an object once made (each is made by one command), so that a
# failure halfway undoes exactly what was made.
made() { echo "$1 $2" >>"$state"; }

# Whether this kernel has netem: tried in a throwaway namespace.
have_netem() {
  local probe="$name-probe" ok=0
  ip netns del "$probe" 2>/dev/null || true  # left by an interrupted probe
  ip netns add "$probe" || return 1
  ip -n "$probe" link set lo up
  ip netns exec "$probe" tc qdisc add dev lo root netem delay 1ms 2>/dev/null || ok=1
  ip netns del "$probe"
  return $ok
}

# Shapes the egress of one interface (in namespace $1, "" for the root one).
shape() {
  local ns=$1 dev=$2 rate=$3 delay=$4
  local tc=(tc)
  [[ -n $ns ]] && tc=(ip netns exec "$ns" tc)
  if [[ -n $rate ]]; then
    "${tc[@]}" qdisc add dev "$dev" root handle 1: htb default 10
    "${tc[@]}" class add dev "$dev" parent 1: classid 1:10 htb rate "$rate" ceil "$rate" \
      quantum 65536 # htb's default, rate / 10, is too coarse above 16 mbit
    if [[ -n $delay ]]; then
      "${tc[@]}" qdisc add dev "$dev" parent 1:10 handle 10: netem delay "$delay" limit 100000
    fi
  elif [[ -n $delay ]]; then
    "${tc[@]}" qdisc add dev "$dev" root netem delay "$delay" limit 100000
  fi
}

cmd_up() {
  local count=${1:-} rate="" delay=""
  if ! [[ $count =~ ^[0-9]+$ ]] || ((10#$count < 1 || 10#$count > 200)); then
    die "up wants a node count from 1 to 200, got '${count}'"
  fi
  count=$((10#$count))
  shift
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --rate)
        rate=${2:-}
        if ! [[ $rate =~ ^[0-9]+(\.[0-9]+)?([kmgt]?(bit|bps))$ ]] || [[ $rate =~ ^[0.]+[a-z] ]]; then
          die "--rate '$rate' is not a positive tc rate: use a number and a unit, e.g. 100mbit, 10gbit, 1gbps"
        fi
        shift 2
        ;;
      --delay)
        delay=${2:-}
        [[ $delay =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] ||
          die "--delay '$delay' is not a tc time: use a number and us, ms or s, e.g. 50us"
        shift 2
        ;;
      *) die "up does not know '$1': it takes N, --rate RATE and --delay DELAY" ;;
    esac
  done
  [[ $net =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] ||
    die "--net '$net' must be three octets, e.g. 10.88.0"
  [[ ! -f $state ]] ||
    die "cluster '$name' is already up ($state): \`fake_cluster.sh --name $name down\` first, or pick another --name"
  if ip -4 -o addr show to "$net.0/24" | grep -q .; then
    die "addresses in $net.0/24 are already in use here ($(ip -4 -o addr show to "$net.0/24" | awk '{print $2}' | tr '\n' ' ')): pick another --net"
  fi
  local i taken=()
  ip link show "$bridge" >/dev/null 2>&1 && taken+=("link $bridge")
  for ((i = 0; i < count; i++)); do
    ip netns list | awk '{print $1}' | grep -qx "$(ns_of $i)" && taken+=("namespace $(ns_of $i)")
    ip link show "$(host_end_of $i)" >/dev/null 2>&1 && taken+=("link $(host_end_of $i)")
  done
  if [[ ${#taken[@]} -gt 0 ]]; then
    die "${taken[*]}: already there, not made by a cluster '$name' that is up: remove them, or pick another --name"
  fi
  command -v tc >/dev/null || die "the tc command (iproute2) is missing: apt-get install iproute2"
  if [[ -n $delay ]] && ! have_netem; then
    die "--delay needs tc's netem qdisc, which this kernel does not have (no sch_netem); leave --delay out (--rate works: it uses htb) or use a kernel with CONFIG_NET_SCH_NETEM"
  fi

  mkdir -p "$state_root"
  # Whatever stops `up` halfway (a failed command, ^C) undoes what it made.
  trap 'echo "fake_cluster.sh: up failed; removing what it made" >&2; tear_down' EXIT
  trap 'exit 130' INT TERM
  {
    echo "nodes $count"
    echo "net $net"
    echo "rate ${rate:--}"
    echo "delay ${delay:--}"
  } >"$state"
  ip link add "$bridge" type bridge
  made link "$bridge"
  ip addr add "$net.1/24" dev "$bridge"
  ip link set "$bridge" up
  local ns host_end
  for ((i = 0; i < count; i++)); do
    ns=$(ns_of $i)
    host_end=$(host_end_of $i)
    ip netns add "$ns"
    made netns "$ns"
    ip -n "$ns" link set lo up
    ip link add "$host_end" type veth peer name "$name$i-n"
    made link "$host_end"
    ip link set "$name$i-n" netns "$ns"
    ip -n "$ns" link set "$name$i-n" name eth0
    ip -n "$ns" addr add "$net.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip link set "$host_end" master "$bridge"
    ip link set "$host_end" up
    # Toward the node on the host end, from it on eth0: both directions.
    shape "" "$host_end" "$rate" "$delay"
    shape "$ns" eth0 "$rate" "$delay"
  done
  trap - EXIT INT TERM
  cmd_status
}

cmd_status() {
  local count i ns state_of
  count=$(node_count)
  echo "cluster $name: $count nodes on bridge $bridge ($(sed -n 's/^net //p' "$state").1/24)," \
    "rate $(sed -n 's/^rate //p' "$state"), delay $(sed -n 's/^delay //p' "$state")"
  for ((i = 0; i < count; i++)); do
    ns=$(ns_of $i)
    state_of="cut"
    ip link show "$(host_end_of $i)" 2>/dev/null | grep -q "master $bridge " && state_of=up
    printf 'node %d  netns %s  %s  link %s  processes %d\n' "$i" "$ns" \
      "$(sed -n 's/^net //p' "$state").$((10 + i))" "$state_of" \
      "$(ip netns pids "$ns" 2>/dev/null | wc -l)"
  done
}

cmd_run() {
  [[ $# -ge 2 ]] || die "run wants a node and a command: fake_cluster.sh run 0 hostname -I"
  check_node "$1"
  local ns
  ns=$(ns_of $((10#$1)))
  shift
  exec ip netns exec "$ns" "$@"
}

cmd_link() {
  [[ $# -eq 1 ]] || die "$verb wants one node: fake_cluster.sh $verb 1"
  check_node "$1"
  if [[ $verb == cut ]]; then
    ip link set "$(host_end_of $((10#$1)))" nomaster
  else
    ip link set "$(host_end_of $((10#$1)))" master "$bridge"
  fi
}

case "$verb" in
  up) cmd_up "$@" ;;
  down)
    [[ $# -eq 0 ]] || die "down takes no arguments"
    [[ -f $state ]] || echo "fake_cluster.sh: cluster '$name' is not up; nothing to remove" >&2
    tear_down
    ;;
  status) cmd_status ;;
  run) cmd_run "$@" ;;
  cut | heal) cmd_link "$@" ;;
  *) die "unknown verb '$verb': use up, run, cut, heal, status or down" ;;
esac
