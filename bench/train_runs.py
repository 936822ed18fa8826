"""One `brigade train` run on synthetic tokens, as the side-by-side benchmarks
(compare_tp.py, compare_pipeline.py, activation_bytes.py) start it: what it
printed at start and its metrics.jsonl rows.

Threads are always given explicitly (train.threads), never left to the
launcher's OMP_NUM_THREADS default, so "one process with 2 threads" and
"2 ranks with one thread each" are what runs; the run's own "N threads per
rank" line is parsed back so a caller can check it.
"""

import json
import os
import re
import statistics
import subprocess
import sys

SKIP_STEPS = 2  # warm-up: the first steps allocate and fault in the workspaces


class RunFailed(Exception):
    pass


def train(brigade, config, run_dir, steps, nproc=1, threads=1, overrides=()):
    """Trains `config` for `steps` steps; returns {"stderr", "rows", "threads"}."""
    argv = [brigade, "train", config,
            "--set", "data.synthetic=true",
            "--set", f"train.steps={steps}",
            "--set", f"train.run_dir=\"{run_dir}\"",
            "--set", "train.eval_every=0",
            "--set", "train.checkpoint_every=0",
            "--set", f"train.threads={threads}"]
    if nproc > 1:
        argv += ["--nproc", str(nproc)]
    for o in overrides:
        argv += ["--set", o]
    print("$ " + " ".join(argv), file=sys.stderr, flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RunFailed(f"{' '.join(argv)}\nexited with status {proc.returncode}\n"
                        f"--- stderr ---\n{proc.stderr[-4000:]}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))
            if '"step_ms"' in line]
    if len(rows) != steps:
        raise RunFailed(f"{run_dir}/metrics.jsonl has {len(rows)} step rows, expected {steps}")
    threads_seen = re.search(r"(\d+) threads per rank", proc.stderr)
    return {"stderr": proc.stderr, "rows": rows,
            "threads": int(threads_seen.group(1)) if threads_seen else None}


def timed(rows):
    """The steps after the warm-up (all of them if there are too few)."""
    return rows[SKIP_STEPS:] or rows


def lower_quartile(values):
    """Robust to one scheduler hiccup on a shared machine; the value itself for one sample."""
    values = list(values)
    return statistics.quantiles(values, n=4)[0] if len(values) > 1 else values[0]


def printed_mb(stderr, label):
    """A "<label> X MB" figure from `brigade train`'s start lines, in bytes."""
    m = re.search(label + r" ([\d.]+) MB", stderr)
    if not m:
        raise RunFailed(f"brigade train printed no '{label} ... MB' figure")
    return float(m.group(1)) * 1e6
