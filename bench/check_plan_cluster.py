#!/usr/bin/python3
"""The planner against training across shaped links, and those runs against one node.

  sudo bench/check_plan_cluster.py [--build build] [--rates 1gbit,10gbit] [--steps 24]
                                   [--repeat 2] [--cases tiny,shakespeare]

For each link rate, scripts/fake_cluster.sh makes two nodes (network
namespaces on a bridge, each node's link capped at the rate with htb), and
each case trains 2 nodes x 2 workers at dp 4 (`brigade launch --nnodes 2
--nproc-per-node 2` on each node, so the hierarchical backend: shared memory
inside a node, Gloo between the two leaders) on synthetic tokens. Beside it,
in the same minute, `brigade plan --hardware this-machine --gpus 4 --nodes 2
--link RATE --one-machine --layout config` predicts the step from compute
figures re-timed just before (`bench calibrate --comm-from`, as
check_plan_local.py does, whose reasons apply here), and the same 4 workers
train on one node (`brigade train --nproc 4`, shared memory only).

Prints per case and rate: measured and predicted step time (the lower
quartile of the timed steps, the mean over the repeats) with the error, the
cluster run's tokens/s against the one-node run's, and the exposed
communication per step (metrics.jsonl's exposed_comm_ms) on each. The
issue's target is |error| <= 15% for every case; the exit status is non-zero
if not.

The namespace nodes share this machine's cores: each node's launcher splits
all of them among its own two workers, so four single-thread workers share
two cores (and `plan --one-machine` models exactly that). Needs root.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from check_plan_local import SKIP_STEPS, TARGET, run  # noqa: E402

FAKE_CLUSTER = os.path.join(REPO_ROOT, "scripts", "fake_cluster.sh")
CLUSTER = ["--name", "brgpc", "--net", "10.88.9"]
RDZV = "10.88.9.10:29531"
RUN_TIMEOUT_S = 900
NPROC_PER_NODE = 2
NODES = 2

CASES = {
    "tiny": "examples/tiny.toml",
    "shakespeare": "examples/shakespeare.toml",
    "gpt2-small": "examples/gpt2_small.toml",
}


def cluster(*args):
    run([FAKE_CLUSTER, *CLUSTER, *args])


def train_overrides(steps, run_dir):
    return ["--set", "data.synthetic=true", "--set", f"train.steps={steps}",
            "--set", f"train.run_dir=\"{run_dir}\"", "--set", "train.eval_every=0",
            "--set", "train.checkpoint_every=0"]


def step_rows(run_dir):
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))
            if '"step_ms"' in line]
    return rows[SKIP_STEPS:] or rows


def summary(rows):
    """(lower-quartile step s, tokens/s at that step time, mean exposed comm ms)."""
    step_s = statistics.quantiles([r["step_ms"] / 1e3 for r in rows], n=4)[0]
    tokens = rows[0]["tokens_per_s"] * rows[0]["step_ms"] / 1e3
    return step_s, tokens / step_s, statistics.mean(r.get("exposed_comm_ms", 0.0) for r in rows)


def train_on_cluster(brigade, config, steps, run_dir, token):
    # Under a launcher `brigade train` takes its layout from the config alone.
    command = [brigade, "train", config, *train_overrides(steps, run_dir),
               "--set", f"parallel.dp={NODES * NPROC_PER_NODE}"]
    procs = []
    try:
        for node in (1, 0):
            argv = [FAKE_CLUSTER, *CLUSTER, "run", str(node), brigade, "launch",
                    "--nproc-per-node", str(NPROC_PER_NODE), "--nnodes", str(NODES),
                    "--node-rank", str(node), "--rdzv", RDZV, "--rdzv-token", token,
                    "--metrics", "off", "--", *command]
            print("$ " + " ".join(argv), file=sys.stderr, flush=True)
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=RUN_TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outputs):
        if p.returncode != 0:
            sys.stderr.write(out)
            raise SystemExit(f"check_plan_cluster: a node's launcher exited {p.returncode}")
    return step_rows(run_dir)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(REPO_ROOT, "build"))
    parser.add_argument("--rates", default="1gbit,10gbit")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--cases", default="tiny,shakespeare",
                        help=f"comma-separated, of {', '.join(CASES)}")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("check_plan_cluster: needs root (network namespaces)")
    brigade = os.path.join(args.build, "brigade")
    cases = args.cases.split(",")
    for c in cases:
        if c not in CASES:
            raise SystemExit(f"check_plan_cluster: unknown case {c} (known: {', '.join(CASES)})")
    rates = args.rates.split(",")

    results = []
    with tempfile.TemporaryDirectory(prefix="brigade_plan_cluster_") as tmp:
        full = os.path.join(tmp, "calibration.json")
        run([brigade, "bench", "calibrate", "--out", full])
        for rate in rates:
            cluster("down")  # what a killed earlier run left up (does nothing otherwise)
            cluster("up", str(NODES), "--rate", rate)
            try:
                for name in cases:
                    config = os.path.join(REPO_ROOT, CASES[name])
                    steps = args.steps if name != "gpt2-small" else max(6, args.steps // 4)
                    got = {"measured": [], "predicted": [], "tok": [], "exposed": [],
                           "one_node_tok": [], "one_node_exposed": []}
                    for repeat in range(args.repeat):
                        now = os.path.join(tmp, f"calibration_{rate}_{name}_{repeat}.json")
                        run([brigade, "bench", "calibrate", "--comm-from", full, "--out", now])
                        run_dir = os.path.join(tmp, f"run_{rate}_{name}_{repeat}")
                        step_s, tok, exposed = summary(train_on_cluster(
                            brigade, config, steps, run_dir, f"plan-cluster-{repeat}"))
                        plan = json.loads(run([
                            brigade, "plan", "--hardware", "this-machine", "--calibration", now,
                            "--model", config, "--gpus", str(NODES * NPROC_PER_NODE),
                            "--nodes", str(NODES), "--link", rate, "--one-machine",
                            "--layout", "config", "--json"]))
                        one_dir = run_dir + "_one_node"
                        run([brigade, "train", config, *train_overrides(steps, one_dir),
                             "--nproc", str(NODES * NPROC_PER_NODE)])
                        _, one_tok, one_exposed = summary(step_rows(one_dir))
                        for key, value in (("measured", step_s), ("predicted",
                                                                  plan["step_time_s"]),
                                           ("tok", tok), ("exposed", exposed),
                                           ("one_node_tok", one_tok),
                                           ("one_node_exposed", one_exposed)):
                            got[key].append(value)
                    results.append((name, rate, {k: statistics.mean(v) for k, v in got.items()}))
            finally:
                cluster("down")

    print(f"\n{'case':<14} {'link':>7} {'measured s':>11} {'predicted s':>12} {'error':>8} "
          f"{'tok/s':>8} {'1 node':>8} {'ratio':>6} {'exposed ms':>11} {'1 node':>7}")
    worst = 0.0
    for name, rate, r in results:
        error = (r["predicted"] - r["measured"]) / r["measured"]
        worst = max(worst, abs(error))
        print(f"{name:<14} {rate:>7} {r['measured']:>11.4f} {r['predicted']:>12.4f} "
              f"{100 * error:>+7.1f}% {r['tok']:>8.0f} {r['one_node_tok']:>8.0f} "
              f"{r['tok'] / r['one_node_tok']:>6.2f} {r['exposed']:>11.1f} "
              f"{r['one_node_exposed']:>7.1f}")
    print(f"\nmax |error| {100 * worst:.1f}% (target: every case within {100 * TARGET:.0f}%): "
          f"{'met' if worst <= TARGET else 'NOT met'}")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
