#!/usr/bin/python3
"""Data parallelism against one process on the same cores, in one run.

  compare_dp.py CONFIG [--build build] [--steps 8] [--zero 0 1 2 3] [--nproc 2]
                [--micro-batch B]

For each ZeRO stage asked for, trains CONFIG on synthetic tokens as
  - one process with 2 threads, grad_accum N (the peer), and
  - brigade train --nproc N (the cores split among them, grad_accum 1),
so both see the same global batch of N micro-batches per step, and prints
tokens/s (median over the steps after the first two), the ratio to the peer,
the exposed-communication fraction of the step, the per-rank bytes the
trainer accounts for beside ZeRO's formula (4 + 4 + 8 bytes per parameter,
divided by N from stage 1, 2 and 3 for the optimizer, gradients and
parameters), and the largest per-rank peak RSS. Runs one after the other, so
they never share the cores. Exits non-zero if a run fails.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
SKIP_STEPS = 2


def train(brigade, config, run_dir, steps, micro_batch, extra):
    argv = [brigade, "train", config,
            "--set", "data.synthetic=true",
            "--set", f"train.steps={steps}",
            "--set", f"train.run_dir=\"{run_dir}\"",
            "--set", "train.eval_every=0"] + extra
    if micro_batch:
        argv += ["--set", f"train.micro_batch={micro_batch}"]
    print("$ " + " ".join(argv), file=sys.stderr, flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"compare_dp: run failed with status {proc.returncode}")
    memory = re.search(r"per rank: parameters ([\d.]+) MB, gradients ([\d.]+) MB, "
                       r"optimizer state ([\d.]+) MB", proc.stderr)
    params = re.search(r"brigade train: (\d+) parameters", proc.stderr)
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))
            if '"tokens_per_s"' in line]
    timed = rows[SKIP_STEPS:] or rows
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
        "exposed": statistics.median(r.get("exposed_comm_fraction", 0.0) for r in timed),
        "memory_mb": tuple(float(x) for x in memory.groups()) if memory else None,
        "peak_rss_mb": max(max(r.get("peak_rss_bytes_per_rank", [r["peak_rss_bytes"]]))
                           for r in rows) / 1e6,
        "num_params": int(params.group(1)) if params else 0,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--build", default=os.path.join(REPO_ROOT, "build"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--zero", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--micro-batch", type=int, default=0)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    brigade = os.path.join(args.build, "brigade")

    with tempfile.TemporaryDirectory(prefix="brigade_compare_dp_") as tmp:
        peer = train(brigade, args.config, os.path.join(tmp, "one"), args.steps,
                     args.micro_batch,
                     ["--set", "train.threads=2", "--set", f"train.grad_accum={args.nproc}"])
        results = []
        for zero in args.zero:
            run = train(brigade, args.config, os.path.join(tmp, f"dp_zero{zero}"), args.steps,
                        args.micro_batch,
                        ["--nproc", str(args.nproc), "--set", f"parallel.zero={zero}"])
            results.append((zero, run))

    print(f"\n{os.path.basename(args.config)}: {args.steps} steps, median of the last "
          f"{max(args.steps - SKIP_STEPS, 1)}")
    print(f"{'run':<24} {'tokens/s':>10} {'vs 1x2thr':>10} {'exposed comm':>13} "
          f"{'P/G/O MB per rank':>18} {'formula':>14} {'peak RSS MB':>12}")

    def row(name, r, dp, zero):
        mem = "/".join(f"{x:.0f}" for x in r["memory_mb"]) if r["memory_mb"] else "?"
        n = r["num_params"]
        formula = (4 * n / (dp if zero >= 3 else 1), 4 * n / (dp if zero >= 2 else 1),
                   8 * n / (dp if zero >= 1 else 1))
        expected = "/".join(f"{x / 1e6:.0f}" for x in formula)
        print(f"{name:<24} {r['tokens_per_s']:>10.0f} "
              f"{r['tokens_per_s'] / peer['tokens_per_s']:>9.2f}x "
              f"{100 * r['exposed']:>12.1f}% {mem:>18} {expected:>14} {r['peak_rss_mb']:>12.0f}")

    row("1 process, 2 threads", peer, 1, 0)
    for zero, r in results:
        row(f"dp={args.nproc} ZeRO-{zero}", r, args.nproc, zero)


if __name__ == "__main__":
    main()
