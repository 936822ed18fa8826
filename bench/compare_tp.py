#!/usr/bin/python3
"""Tensor parallelism against one process on the same cores, in one run.

  compare_tp.py [--build build] [--repeat 2] [--shapes tiny gpt2] [--steps-tiny 20]
                [--steps-gpt2 8] [--micro-batch-gpt2 2]

For the tiny shape (examples/tiny.toml: B 8, T 128) and GPT-2 small's shape
(examples/gpt2_small.toml at T 256, B --micro-batch-gpt2) trains on
synthetic tokens, back to back and alternating, --repeat times:
  - one process with 2 threads (train.threads = 2),
  - tp 2: two ranks of one thread each (--nproc 2, parallel.tp = 2,
    train.threads = 1), and
  - tp 2 with sequence parallelism (parallel.sequence_parallel = true),
all with the same micro-batch and grad_accum 1, so the same tokens per
step. Per case it prints the step time (lower quartile of the timed steps,
all after the first two, then the median over the repeats), tokens/s
(tokens per step over that step time), the ratio to the one-process run,
and the exposed tensor-parallel communication share of the step
(metrics.jsonl's tp_comm_ms over step_ms: the trainer counts every tp
collective's wait as exposed, none of it overlaps compute).

Issue 12's floor: tp 2 reaches at least 0.85x the one-process tokens/s on
GPT-2 small (goal 0.95x); the last lines say whether it was met. The exit
status is non-zero only if a run fails: the floor is the reader's to judge,
and only on a quiet machine (another process on the cores slows the
2-rank runs more than the one process).
"""

import argparse
import os
import statistics
import sys
import tempfile

from train_runs import RunFailed, lower_quartile, timed, train

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
FLOOR, GOAL = 0.85, 0.95

# name -> (config, extra overrides); the micro-batch comes from the options.
SHAPES = {
    "tiny": ("examples/tiny.toml", []),
    "gpt2": ("examples/gpt2_small.toml", ["model.block_size=256"]),
}
# name, processes, threads per process, overrides
CASES = [
    ("1 process, 2 threads", 1, 2, []),
    ("tp 2, 1 thread each", 2, 1, ["parallel.tp=2"]),
    ("tp 2 + sp, 1 thread each", 2, 1, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(REPO_ROOT, "build"))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["tiny", "gpt2"])
    parser.add_argument("--steps-tiny", type=int, default=20)
    parser.add_argument("--steps-gpt2", type=int, default=8)
    parser.add_argument("--micro-batch-gpt2", type=int, default=2)
    args = parser.parse_args()
    brigade = os.path.join(args.build, "brigade")

    results = {}  # (shape, case) -> list of (step_s, tp_share) per repeat
    tokens_per_step = {}
    try:
        with tempfile.TemporaryDirectory(prefix="brigade_compare_tp_") as tmp:
            for repeat in range(args.repeat):
                for shape in args.shapes:
                    config, overrides = SHAPES[shape]
                    steps = args.steps_tiny if shape == "tiny" else args.steps_gpt2
                    if shape == "gpt2":
                        overrides = overrides + [f"train.micro_batch={args.micro_batch_gpt2}"]
                    # Alternating: each case's repeats are spread over the
                    # run, so a slow minute does not land on one case only.
                    order = list(enumerate(CASES))
                    for i, (name, nproc, threads, extra) in order[::1 - 2 * (repeat % 2)]:
                        run_dir = os.path.join(tmp, f"{shape}_{i}_{repeat}")
                        run = train(brigade, os.path.join(REPO_ROOT, config), run_dir, steps,
                                    nproc, threads, overrides + extra)
                        if run["threads"] != threads:
                            raise RunFailed(f"{name}: the run says {run['threads']} threads per "
                                            f"rank, expected {threads}")
                        rows = timed(run["rows"])
                        step_s = lower_quartile(r["step_ms"] for r in rows) / 1e3
                        share = statistics.median(r["tp_comm_ms"] / r["step_ms"] for r in rows)
                        results.setdefault((shape, name), []).append((step_s, share))
                        # tokens/s * step time: the tokens of one step, the same every step.
                        tokens_per_step[shape] = round(rows[0]["tokens_per_s"] *
                                                       rows[0]["step_ms"] / 1e3)
    except RunFailed as e:
        print(f"compare_tp: {e}", file=sys.stderr)
        return 1

    verdicts = []
    for shape in args.shapes:
        print(f"\n{shape} ({SHAPES[shape][0]}, {tokens_per_step[shape]} tokens/step): step time "
              f"= lower quartile of the timed steps, median over {args.repeat} repeat(s)")
        print(f"{'case':<28} {'step ms':>9} {'tokens/s':>10} {'vs 1x2thr':>10} "
              f"{'tp comm share':>14}   per repeat (ms)")
        base = statistics.median(s for s, _ in results[(shape, CASES[0][0])])
        for name, *_ in CASES:
            runs = results[(shape, name)]
            step_s = statistics.median(s for s, _ in runs)
            share = statistics.median(c for _, c in runs)
            ratio = base / step_s
            print(f"{name:<28} {1e3 * step_s:>9.1f} {tokens_per_step[shape] / step_s:>10.0f} "
                  f"{ratio:>9.2f}x {100 * share:>13.1f}%   "
                  + " ".join(f"{1e3 * s:.0f}" for s, _ in runs))
            if shape == "gpt2" and name != CASES[0][0]:
                verdicts.append((name, ratio))
    for name, ratio in verdicts:
        print(f"GPT-2 small {name}: {ratio:.2f}x the one-process tokens/s; floor {FLOOR}x: "
              f"{'met' if ratio >= FLOOR else 'not met'}, goal {GOAL}x: "
              f"{'met' if ratio >= GOAL else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
