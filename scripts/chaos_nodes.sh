#!/usr/bin/env bash
# chaos_nodes.sh: issue 14's chaos run across nodes. 3 namespace nodes and
# 1 standby (scripts/fake_cluster.sh) train one job under
# `--inject chaos:mtbf=S:kinds=kill+stop+partition+kill-agent`; this script
# plays the cluster manager and checks the run at its end. Needs root.
#
#   chaos_nodes.sh --out DIR [--steps N] [--mtbf S] [--seed N] [--bound-s S]
#                  [--name NAME --net A.B.C] [--port P] [--brigade PATH]
#                  [--min-ettr F] [--model-tolerance F] [--model-mtbf chaos|realized]
#                  [--require-kinds kill+stop+...]
#
# The cluster manager: when a machine's launcher exits while the job runs
# (its agent killed, or it gave up once cut off the network), the machine
# is brought back (its link up again) and started as `brigade launch
# --standby` with a fresh --node-id (a replaced machine: a machine lost
# twice would be quarantined), so the job can always grow back. At most
# --max-replacements of them, never a loop. Node 0 draws no whole-node
# fault (its launcher hosts the store, elastic/fault_injection.h).
#
# The checks (scripts/chaos_nodes_check.py, into DIR/report.json): node 0's
# launcher finished by itself, exit 0, within --bound-s (else a hang: every
# launcher is killed by pid); every committed checkpoint verifies (`brigade
# ckpt inspect`); incidents.jsonl has one incident for every generation in
# which a fault was raised, of a kind raised there (kill: crash, stop: hang,
# partition: partition, kill-agent: node_lost), and none elsewhere but
# rejoins; the ETTR of the run, and `brigade ettr` against the failure
# model (at least --min-ettr, 0.95 by default, and the model within 3
# points, at the chaos mode's MTBF, or with --model-mtbf realized at the
# run's own: a short run's few faults come by chance); every kind of --require-kinds raised; no launcher left running
# 60 s after node 0 ended; no restart that redid more steps than the
# snapshots allow. Exit 0 when every check holds.
#
# The pids it holds are the launchers' own (fake_cluster.sh run execs ip
# netns exec, which execs brigade): the hang path and the cleanup signal
# the launchers, SIGTERM first, then SIGKILL; `cluster down` sweeps the
# namespaces after, its output in DIR/logs/cluster_down.log.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
brigade=$here/../build/brigade
name=brgch
net=10.88.41
port=29561
out=
steps=600
mtbf=60
seed=1
bound_s=
max_replacements=12
kinds=kill+stop+partition+kill-agent
min_ettr=0.95
model_tolerance=0.03
model_mtbf=chaos
require_kinds=

die() {
  echo "chaos_nodes.sh: $*" >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || die "$1 needs a value"
  case "$1" in
    --out) out=$2 ;;
    --steps) steps=$2 ;;
    --mtbf) mtbf=$2 ;;
    --seed) seed=$2 ;;
    --bound-s) bound_s=$2 ;;
    --name) name=$2 ;;
    --net) net=$2 ;;
    --port) port=$2 ;;
    --brigade) brigade=$2 ;;
    --kinds) kinds=$2 ;;
    --max-replacements) max_replacements=$2 ;;
    --min-ettr) min_ettr=$2 ;;
    --model-tolerance) model_tolerance=$2 ;;
    --model-mtbf) model_mtbf=$2 ;;
    --require-kinds) require_kinds=$2 ;;
    *) die "unknown option $1 (see the top of $0)" ;;
  esac
  shift 2
done
[[ -n $out ]] || die "pass --out DIR (the run directory, logs and report go there)"
[[ $EUID -eq 0 ]] || die "needs root (network namespaces)"
[[ -x $brigade ]] || die "$brigade is not built: ninja -C build brigade"
# A hang is a run far past its steps: 2 s a step is 10x this model's.
[[ -n $bound_s ]] || bound_s=$((steps * 2 + 300))

mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
run=$out/run
config=$out/config.toml
# keep_checkpoints more than the run writes: every checkpoint stays, so
# every one is verified.
# A widened tiny model: steps of about 0.1-0.3 s on 3 loaded cores, so that
# steps, not restarts, fill the run. dp 3 x grad_accum 2 keeps its global
# batch on 2 nodes too (dp 2 x grad_accum 3), while a lost node is replaced.
cat >"$config" <<EOF
[model]
n_layer = 2
n_head = 4
n_embd = 128
block_size = 64
vocab_size = 256
[train]
micro_batch = 8
grad_accum = 2
steps = $steps
seed = 5
threads = 1
snapshot_every = 1
checkpoint_every = 200
keep_checkpoints = $((steps / 200 + 2))
run_dir = "$run"
[optim]
lr = 1e-3
min_lr = 1e-3
[data]
synthetic = true
[parallel]
dp = 3
timeout_s = 30
EOF

cluster() { "$here/fake_cluster.sh" --name "$name" --net "$net" "$@"; }

declare -A pid=()
# Every launcher still running: SIGTERM (its grace), then SIGKILL after
# 10 s; then the namespaces.
cleanup() {
  local p
  for p in "${pid[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pid[@]}"; do
    for _ in $(seq 20); do
      kill -0 "$p" 2>/dev/null || break
      sleep 0.5
    done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  pid=()
  cluster down >>"$out/logs/cluster_down.log" 2>&1 || true
}
trap cleanup EXIT
# A signal (the test's limit) ends the script through its EXIT trap.
trap 'exit 143' TERM INT

launch() { # NAMESPACE_NODE MACHINE_ID [--node-rank R | --standby]
  local node=$1 id=$2
  shift 2
  # A simple command in the background: $! is the launcher itself.
  "$here/fake_cluster.sh" --name "$name" --net "$net" run "$node" \
    "$brigade" launch --nproc-per-node 1 --nnodes 2:3 \
    --rdzv "$net.10:$port" --rdzv-token chaos-nodes --rdzv-timeout-s 60 \
    --max-restarts 100 --node-id "$id" \
    --inject "chaos:mtbf=$mtbf:kinds=$kinds:seed=$seed" "$@" \
    -- train "$config" >"$out/logs/$id.log" 2>&1 &
  pid[$node]=$!
  echo "$(date +%s.%N) start $id on namespace node $node: $*" >>"$out/logs/harness.log"
}

cluster down >"$out/logs/cluster_down.log" 2>&1 || true
cluster up 4 >"$out/logs/cluster_up.log" 2>&1
start=$(date +%s)
launch 3 machine-3 --standby
launch 1 machine-1 --node-rank 1
launch 2 machine-2 --node-rank 2
launch 0 machine-0 --node-rank 0
next_id=4
replacements=0
hang=0
leftover=0

while kill -0 "${pid[0]}" 2>/dev/null; do
  if (($(date +%s) - start > bound_s)); then
    hang=1
    echo "$(date +%s.%N) HANG: node 0 still running after $bound_s s" >>"$out/logs/harness.log"
    break
  fi
  for node in 1 2 3; do
    p=${pid[$node]:-}
    [[ -n $p ]] || continue
    kill -0 "$p" 2>/dev/null && continue
    status=0
    wait "$p" || status=$?
    unset "pid[$node]"
    echo "$(date +%s.%N) namespace node $node's launcher exited $status" >>"$out/logs/harness.log"
    kill -0 "${pid[0]}" 2>/dev/null || break
    # 0: the job is over for it (done, or a standby released), not a loss.
    ((status != 0)) || continue
    if ((replacements >= max_replacements)); then
      echo "$(date +%s.%N) no replacement left (--max-replacements $max_replacements)" \
        >>"$out/logs/harness.log"
      continue
    fi
    # A replaced machine: its link up again, a fresh id.
    ip -n "$name$node" link set dev eth0 up
    replacements=$((replacements + 1))
    launch "$node" "machine-$next_id" --standby
    next_id=$((next_id + 1))
  done
  sleep 0.5
done

end=$(date +%s)
node0_status=-1
if ((hang == 0)); then
  node0_status=0
  wait "${pid[0]}" || node0_status=$?
  unset "pid[0]"
  # The others end with the job (a standby is released); bounded.
  for node in 1 2 3; do
    p=${pid[$node]:-}
    [[ -n $p ]] || continue
    for _ in $(seq 120); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    status=0
    if kill -0 "$p" 2>/dev/null; then
      echo "$(date +%s.%N) namespace node $node's launcher still running 60 s after node 0 ended" \
        >>"$out/logs/harness.log"
      leftover=$((leftover + 1))
      kill -TERM "$p"
      for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
      kill -KILL "$p" 2>/dev/null || true
    fi
    wait "$p" || status=$?
    unset "pid[$node]"
    echo "$(date +%s.%N) namespace node $node's launcher exited $status" >>"$out/logs/harness.log"
  done
fi
cleanup
trap - EXIT TERM INT

python3 "$here/chaos_nodes_check.py" --brigade "$brigade" --out "$out" --run "$run" \
  --node0-status "$node0_status" --hang "$hang" --wall-s $((end - start)) \
  --replacements "$replacements" --leftover "$leftover" --min-ettr "$min_ettr" \
  --model-tolerance "$model_tolerance" --model-mtbf "$model_mtbf" \
  --require-kinds "$require_kinds"
