#!/usr/bin/python3
"""What checkpointing every step costs the training loop, and how fast shards are written.

  compare_ckpt.py CONFIG [--build build] [--steps 8] [--nproc 2] [--zero 1]

Trains CONFIG on synthetic tokens with `brigade train --nproc N`, once with
no checkpoints but the last and once with a checkpoint after every step
(asynchronous: the loop waits only for the copy of each rank's state), and
prints the median step time of each (steps after the first two, the last
left out) and their ratio. Then compares the shards' write throughput
(rank 0's shard bytes over its background write time, times N for all
ranks writing at once) with `dd` writing the same number of bytes to the
same directory with fdatasync. Runs one after the other. Exits non-zero if a
run fails.
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


def train(brigade, config, run_dir, args, every):
    argv = [brigade, "train", "--nproc", str(args.nproc), config,
            "--set", "data.synthetic=true",
            "--set", f"train.steps={args.steps}",
            "--set", f"train.run_dir=\"{run_dir}\"",
            "--set", f"train.checkpoint_every={every}",
            "--set", "train.keep_checkpoints=2",
            "--set", f"parallel.zero={args.zero}"]
    print("$ " + " ".join(argv), file=sys.stderr, flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"compare_ckpt: run failed with status {proc.returncode}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))
            if '"step_ms"' in line]
    return rows


def median_step_ms(rows):
    timed = rows[2:-1] or rows
    return statistics.median(r["step_ms"] for r in timed)


def dd_mb_per_s(directory, megabytes):
    path = os.path.join(directory, "dd.bin")
    proc = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={megabytes}",
                           "conv=fdatasync"], capture_output=True, text=True)
    os.remove(path)
    match = re.search(r"copied, ([\d.]+) s", proc.stderr)
    if proc.returncode != 0 or not match:
        raise SystemExit(f"compare_ckpt: dd failed: {proc.stderr}")
    return megabytes / float(match.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--build", default=os.path.join(REPO_ROOT, "build"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--zero", type=int, default=1)
    parser.add_argument("--dir", default=None, help="where runs write (default: a temp dir)")
    args = parser.parse_args()
    brigade = os.path.join(args.build, "brigade")

    with tempfile.TemporaryDirectory(prefix="brigade_compare_ckpt_", dir=args.dir) as tmp:
        plain = train(brigade, args.config, os.path.join(tmp, "plain"), args, 0)
        every = train(brigade, args.config, os.path.join(tmp, "every"), args, 1)
        saves = [r["checkpoint"] for r in every if "checkpoint" in r]
        if not saves:
            raise SystemExit("compare_ckpt: no background save finished during the run")
        shard_mb = statistics.median(s["rank0_bytes"] for s in saves) / 1e6
        write_ms = statistics.median(s["write_ms"] for s in saves)
        blocking_ms = statistics.median(s["blocking_ms"] for s in saves)
        dd = dd_mb_per_s(tmp, max(1, int(shard_mb * args.nproc)))

    a, b = median_step_ms(plain), median_step_ms(every)
    print(f"\n{os.path.basename(args.config)}: dp {args.nproc}, ZeRO {args.zero}, "
          f"{args.steps} steps")
    print(f"step time, no checkpoints:          {a:10.1f} ms")
    print(f"step time, a checkpoint every step: {b:10.1f} ms   ({b / a:.3f}x)")
    print(f"training blocked per save (copy):   {blocking_ms:10.1f} ms")
    print(f"shard per rank {shard_mb:.1f} MB written in {write_ms:.0f} ms: "
          f"{shard_mb * args.nproc / (write_ms / 1e3):.0f} MB/s for all {args.nproc} ranks; "
          f"dd with fdatasync: {dd:.0f} MB/s")


if __name__ == "__main__":
    main()
