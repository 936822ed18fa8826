#!/usr/bin/python3
"""Pipeline schedules' measured bubbles against their theory, in one run.

  compare_pipeline.py [--build build] [--repeats 1] [--shapes tiny wide]
                      [--microbatches 4 8] [--steps 6]

For each shape and each micro-batch count m, trains on synthetic tokens,
back to back: one process with 2 threads and grad_accum m (the peer: same
model, same global batch), then pp 2 with one thread per stage under each
schedule: gpipe, 1f1b, interleaved (2 virtual stages per rank) and zb-h1.
Shapes: "tiny" is examples/tiny.toml (4 blocks of C 256, B 8, T 128);
"wide" is GPT-2 small's width (C 768, 12 heads) with 4 blocks, T 128,
B 2 and a 2048-token vocabulary, so each stage has tens of milliseconds of
work per micro-batch and the LM head (the last stage's extra work) is
small beside a block: the theory assumes equal stages.

Per run it prints the measured bubble: each stage's time waiting for a
peer's activation or gradient, for its sends to leave, and at the
step's end for its peers' drain (the losses' sum over the stages, where
a stage that finished its list early waits; metrics.jsonl's
bubble_ms_per_stage, one rank per stage) over the step time, the median over the timed steps
(all after the first two), for stage 0 and averaged over the stages; next
to it the schedule's theoretical bubble, which `brigade train` prints at
start (its instruction lists simulated with equal stages, backward twice
forward, free transfers: stage 0's share of the step) and the planner's
bubble share for the same job (`brigade plan --hardware this-machine
--layout config`: the schedule simulated under this machine's calibrated
costs; the first call calibrates and caches them); tokens/s (median) and
its ratio to the one-process run. Then, per shape and m, the ZB-H1 /
1F1B ratio of the stage-averaged measured bubbles: issue 13's floor is at
most 0.5, its goal at most 0.3.

With --repeats N every run is repeated N times, the whole sequence over
(so the schedules alternate in time and a slow minute hits them all); each
figure is the median over the repeats, with its spread (min-max) after it
where N > 1, and the ratio is each repeat's ZB-H1 / 1F1B, its median and
spread. Timing numbers mean something only on a quiet machine. The exit
status is non-zero only if a run fails.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from train_runs import RunFailed, timed, train

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
FLOOR, GOAL = 0.5, 0.3

SHAPES = {
    "tiny": ("examples/tiny.toml", []),
    "wide": ("examples/gpt2_small.toml",
             ["model.n_layer=4", "model.block_size=128", "model.vocab_size=2048",
              "train.micro_batch=2"]),
}
SCHEDULES = [
    ("gpipe", []),
    ("1f1b", []),
    ("interleaved", ["parallel.virtual_stages=2"]),
    ("zb-h1", []),
]


def median_of(rows, f):
    return statistics.median(f(r) for r in timed(rows))


def planned_bubble(brigade, config, overrides):
    """The planner's bubble share of the step for the same job (`brigade plan
    --layout config`: the schedule simulated under this machine's calibrated
    costs, backward split as the kernels measure, transfers included)."""
    argv = [brigade, "plan", "--hardware", "this-machine", "--model", config, "--gpus", "2",
            "--layout", "config", "--json"]
    for o in overrides:
        argv += ["--set", o]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RunFailed(f"{' '.join(argv)}\nexited with status {proc.returncode}\n{proc.stderr}")
    plan = json.loads(proc.stdout)
    return plan["time_s"]["bubble"] / plan["step_time_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(REPO_ROOT, "build"))
    parser.add_argument("--repeats", "--repeat", dest="repeats", type=int, default=1)
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["tiny", "wide"])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    brigade = os.path.join(args.build, "brigade")

    # (shape, m, schedule or None for the peer) -> list of per-repeat results
    results = {}
    try:
        with tempfile.TemporaryDirectory(prefix="brigade_compare_pipeline_") as tmp:
            for repeat in range(args.repeats):
                for shape in args.shapes:
                    config, overrides = SHAPES[shape]
                    config = os.path.join(REPO_ROOT, config)
                    for m in args.microbatches:
                        base = overrides + [f"train.grad_accum={m}"]
                        run = train(brigade, config, os.path.join(tmp, f"{shape}_{m}_one_{repeat}"),
                                    args.steps, 1, 2, base)
                        results.setdefault((shape, m, None), []).append(
                            {"tokens_per_s": median_of(run["rows"], lambda r: r["tokens_per_s"])})
                        for schedule, extra in SCHEDULES:
                            pipeline = base + ["parallel.pp=2",
                                               f"parallel.schedule=\"{schedule}\""] + extra
                            run = train(brigade, config,
                                        os.path.join(tmp, f"{shape}_{m}_{schedule}_{repeat}"),
                                        args.steps, 2, 1, pipeline)
                            theory = re.search(r"theoretical bubble ([\d.]+)% of the step",
                                               run["stderr"])
                            if not theory:
                                raise RunFailed(f"{schedule}: brigade train printed no "
                                                "theoretical bubble")
                            results.setdefault((shape, m, schedule), []).append({
                                "tokens_per_s": median_of(run["rows"],
                                                          lambda r: r["tokens_per_s"]),
                                "stage0": median_of(run["rows"], lambda r:
                                                    r["bubble_ms_per_stage"][0] / r["step_ms"]),
                                "mean": median_of(run["rows"], lambda r:
                                                  statistics.mean(r["bubble_ms_per_stage"]) /
                                                  r["step_ms"]),
                                "theory": float(theory.group(1)) / 100,
                                "planned": planned_bubble(brigade, config,
                                                          pipeline + ["train.threads=1"]),
                            })
    except RunFailed as e:
        print(f"compare_pipeline: {e}", file=sys.stderr)
        return 1

    def med(key, runs):
        return statistics.median(r[key] for r in runs)

    def spread(values, scale=1.0, fmt="{:.1f}"):
        """The spread over the repeats, " (lo-hi)", or nothing for one."""
        if len(values) < 2:
            return ""
        return " (" + fmt.format(scale * min(values)) + "-" + fmt.format(scale * max(values)) + ")"

    def cell(key, runs, width):
        values = [r[key] for r in runs]
        text = f"{100 * statistics.median(values):.1f}%" + spread(values, 100)
        return f"{text:>{width}}"

    wide = 14 if args.repeats > 1 else 0
    verdicts = []
    for shape in args.shapes:
        for m in args.microbatches:
            peers = [r["tokens_per_s"] for r in results[(shape, m, None)]]
            peer = statistics.median(peers)
            print(f"\n{shape}, pp 2, m = {m}: medians over the timed steps, then over "
                  f"{args.repeats} repeat(s)" + (" (spread: min-max)" if args.repeats > 1 else ""))
            print(f"{'run':<22} {'bubble st0':>{11 + wide}} {'bubble mean':>{12 + wide}} "
                  f"{'theory':>8} {'planner':>8} {'tokens/s':>{10 + wide}} {'vs 1x2thr':>10}")
            peer_text = f"{peer:.0f}" + spread(peers, fmt="{:.0f}")
            print(f"{'1 process, 2 threads':<22} {'':>{11 + wide}} {'':>{12 + wide}} {'':>8} "
                  f"{'':>8} {peer_text:>{10 + wide}} {1:>9.2f}x")
            for schedule, _ in SCHEDULES:
                runs = results[(shape, m, schedule)]
                tps_values = [r["tokens_per_s"] for r in runs]
                tps = statistics.median(tps_values)
                tps_text = f"{tps:.0f}" + spread(tps_values, fmt="{:.0f}")
                print(f"{schedule:<22} {cell('stage0', runs, 11 + wide)} "
                      f"{cell('mean', runs, 12 + wide)} {100 * med('theory', runs):>7.1f}% "
                      f"{100 * med('planned', runs):>7.1f}% {tps_text:>{10 + wide}} "
                      f"{tps / peer:>9.2f}x")
            ratios = [zb["mean"] / one["mean"] if one["mean"] > 0 else float("inf")
                      for one, zb in zip(results[(shape, m, "1f1b")], results[(shape, m, "zb-h1")])]
            verdicts.append((shape, m, statistics.median(ratios), spread(ratios, fmt="{:.2f}")))
    print()
    for shape, m, ratio, ratio_spread in verdicts:
        print(f"{shape}, m = {m}: ZB-H1 / 1F1B measured bubble {ratio:.2f}{ratio_spread}; "
              f"floor <= {FLOOR}: {'met' if ratio <= FLOOR else 'not met'}, goal <= {GOAL}: "
              f"{'met' if ratio <= GOAL else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
