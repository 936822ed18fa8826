#!/usr/bin/python3
"""What an in-memory snapshot every step costs the training loop.

  compare_snapshots.py CONFIG [--build build] [--steps 12] [--nproc 2] [--zero 0] [--rounds 2]
                      [--every 1] [--skip 3] [--paired K] [--keep DIR]

Trains CONFIG on synthetic tokens with `brigade train --nproc N` (so an
agent supervises the workers and gives them a snapshot area on /dev/shm),
once with train.snapshot_every=0 and once with --every (default 1), and
prints the mean wall time per step of each (metrics.jsonl's loop_ms: the step plus all the
loop does around it, the snapshot's copy and any wait for the previous
snapshot included; the first --skip steps and the last left out: the first
step sets up, and the first two snapshots allocate their memory, which
every later one reuses) and their ratio, with the snapshots' own blocking
and background times. The runs alternate (off, on,
off, on) so a drift of the machine shows. Exits non-zero if a run fails or
the snapshots were turned off.

With --paired K (K >= 3) it also runs once with train.snapshot_every=K and
reads each snapshot's cost from neighbouring steps of that one run: the
snapshot of step s is written by step s's update (once a spare exists;
before that, and when it is copied instead, while step s+1 runs) and
committed while step s+1 runs, so its cost is loop_ms(s) + loop_ms(s+1)
less loop_ms(s-1) + loop_ms(s+2), which carry none of it. This VM's speed
drifts by up to 30% over minutes, more than the effect between separate
runs; within four steps far less, and the median over the cycles leaves
out a step a burst of other work hit. The ratio for a snapshot every step
is 1 + that median over the clean steps' mean: it assumes a snapshot's
cost stays in those two steps (the writer's work ends well within one).
--skip (in steps; default 4K here) leaves out the first snapshots: three
write fresh files, the next ones map their spares for the first time.
(Before the update wrote the snapshots, session 18, the cost was
loop_ms(s+1) less the mean of loop_ms(s) and loop_ms(s+2), with K = 2.)

Each reading is also taken in CPU time: the CPU all the ranks' processes
spent in a step (metrics.jsonl's process_cpu_ms_per_rank, summed), every
thread counted, the snapshot's writer included. Where the ranks fill the
cores (two ranks of one thread on two cores here) a snapshot's work costs
the step that much CPU divided among the cores, and the CPU of a step does
not move with who waited for a core. It does move with memory stalls, so a
snapshot's stores that slow the step's own work show in it, and so does the
host's load: on this VM it drifted as much as wall time (docs/PERFORMANCE.md,
session 21).

--paired K reads high on a VM that makes memory idle for tens of seconds
dearer to write again (this one: 743 MB of streaming stores into a tmpfs
file last written 15 s before took 56-84 ms, 45 s before 90-139 ms, and a
step's update now and then 1-2.5 s): its spares idle K times longer than
with a snapshot every step. The alternating runs do not have that bias.

--paired also splits each snapshot's cost by the step's parts (metrics.jsonl's
breakdown, per rank): where the two steps it touches spend more than the two
beside them. --keep DIR keeps the runs' directories (metrics.jsonl) there.
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


def train(brigade, config, run_dir, args, every):
    argv = [brigade, "train", "--nproc", str(args.nproc), config,
            "--set", "data.synthetic=true",
            "--set", f"train.steps={args.steps}",
            "--set", f"train.run_dir=\"{run_dir}\"",
            "--set", f"train.snapshot_every={every}",
            "--set", f"parallel.zero={args.zero}"]
    print("$ " + " ".join(argv), file=sys.stderr, flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"compare_snapshots: run failed with status {proc.returncode}")
    if every > 0 and "in-memory snapshots" in proc.stderr:
        sys.stderr.write(proc.stderr)
        raise SystemExit("compare_snapshots: the snapshots were turned off during the run")
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))
            if '"loop_ms"' in line]


def cpu_ms(row):
    """The CPU all ranks' processes spent in the step's window."""
    per_rank = row.get("process_cpu_ms_per_rank")
    return sum(per_rank) if per_rank else row["breakdown"]["process_cpu_ms"]


def mean_of(rows, skip, value):
    # The mean, not the median: with a snapshot every k steps, the cost falls
    # on some steps only.
    timed = rows[skip:-1] or rows
    return statistics.mean(value(r) for r in timed)


def mean_loop_ms(rows, skip):
    return mean_of(rows, skip, lambda r: r["loop_ms"])


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--build", default=os.path.join(REPO_ROOT, "build"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--zero", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2, help="0: the --paired run alone")
    parser.add_argument("--every", type=int, default=1, help="train.snapshot_every of the runs with snapshots")
    parser.add_argument("--skip", type=int, default=None,
                        help="steps left out at the start (default 3; with --paired K, 4K: "
                             "the first three snapshots allocate, the next ones map their spares)")
    parser.add_argument("--paired", type=int, default=0, metavar="K",
                        help="also one run with snapshot_every=K, its cost read from its own steps")
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="keep the runs' directories in DIR (default: removed at the end)")
    args = parser.parse_args()
    brigade = os.path.join(args.build, "brigade")
    if args.paired < 0 or args.paired in (1, 2):
        raise SystemExit("compare_snapshots: --paired needs K >= 3 (steps without a snapshot's "
                         "cost on either side of one with it)")
    if args.skip is None:
        args.skip = 4 * args.paired if args.paired else 3

    with tempfile.TemporaryDirectory(prefix="brigade_compare_snapshots_") as tmp:
        runs = args.keep or tmp
        os.makedirs(runs, exist_ok=True)
        if args.rounds > 0:
            alternate(brigade, args, runs)
        if args.paired:
            paired(train(brigade, args.config, os.path.join(runs, "paired"), args, args.paired),
                   args)


PARTS = ("compute", "optimizer", "comm", "ckpt", "other", "compute_runqueue", "process_cpu")


def per_rank_mean(row, part):
    """A part of the step (ms), the mean over the ranks."""
    values = row.get(f"{part}_ms_per_rank") or [row["breakdown"].get(f"{part}_ms", 0.0)]
    return statistics.mean(values)


def parts_of_cost(rows, snapshot_steps):
    """Per part of the breakdown, the median over the snapshots of what steps
    s and s+1 spent more than the mean of s-1 and s+2, per rank."""
    by_step = {r["step"]: r for r in rows if "loop_ms" in r}
    out = []
    for part in PARTS:
        extra = [[], []]
        for s in snapshot_steps:
            beside = (per_rank_mean(by_step[s - 1], part) + per_rank_mean(by_step[s + 2], part)) / 2
            for i in (0, 1):
                extra[i].append(per_rank_mean(by_step[s + i], part) - beside)
        out.append(f"{part} {statistics.median(extra[0]):+.0f} / {statistics.median(extra[1]):+.0f}")
    return ", ".join(out)


def alternate(brigade, args, tmp):
    """Runs without and with snapshots, alternating; prints their means and ratio."""
    off, on, off_cpu, on_cpu, snaps = [], [], [], [], []
    for i in range(args.rounds):
        rows = train(brigade, args.config, os.path.join(tmp, f"off{i}"), args, 0)
        off.append(mean_loop_ms(rows, args.skip))
        off_cpu.append(mean_of(rows, args.skip, cpu_ms))
        rows = train(brigade, args.config, os.path.join(tmp, f"on{i}"), args, args.every)
        on.append(mean_loop_ms(rows, args.skip))
        on_cpu.append(mean_of(rows, args.skip, cpu_ms))
        snaps += [r["snapshot"] for r in rows if "snapshot" in r]
    if not snaps:
        raise SystemExit("compare_snapshots: no snapshot finished during the runs")
    a, b = statistics.median(off), statistics.median(on)
    print(f"\n{os.path.basename(args.config)}: dp {args.nproc}, ZeRO {args.zero}, "
          f"{args.steps} steps x {args.rounds} rounds")
    print(f"wall time per step, no snapshots:        {a:10.1f} ms  "
          f"{[round(x, 1) for x in off]}")
    print(f"wall time per step, snapshots every {args.every:<3}: {b:10.1f} ms  "
          f"{[round(x, 1) for x in on]}  ({b / a:.3f}x)")
    c, d = statistics.median(off_cpu), statistics.median(on_cpu)
    print(f"CPU per step, all ranks, no snapshots:   {c:10.1f} ms  "
          f"{[round(x, 1) for x in off_cpu]}")
    print(f"CPU per step, snapshots every {args.every:<3}:       {d:10.1f} ms  "
          f"{[round(x, 1) for x in on_cpu]}  ({d / c:.3f}x)")
    print(f"snapshot: blocking {statistics.median(s['blocking_ms'] for s in snaps):.1f} ms, "
          f"background {statistics.median(s['write_ms'] for s in snaps):.1f} ms "
          f"(CPU {statistics.median(s.get('write_cpu_ms', 0) for s in snaps):.1f} ms), "
          f"{statistics.median(s['rank0_bytes'] for s in snaps) / 1e6:.1f} MB per rank")


def paired(rows, args):
    """The cost of each snapshot of one run with snapshot_every=K, from its neighbours."""
    k = args.paired
    loop = {r["step"]: r["loop_ms"] for r in rows if "loop_ms" in r}
    cpu = {r["step"]: cpu_ms(r) for r in rows if "loop_ms" in r}
    costs, clean, cpu_costs, cpu_clean, cycles = [], [], [], [], []
    # The snapshot of step s is written by step s's update and committed
    # (or copied) while step s+1 runs; s-1 and s+2 carry none of it. Cycles
    # before --skip (the first snapshots allocate their memory) and the
    # last step are left out.
    for s in range(k, args.steps, k):
        steps = (s - 1, s, s + 1, s + 2)
        if s <= args.skip or s + 2 >= args.steps or any(t not in loop for t in steps):
            continue
        without = loop[s - 1] + loop[s + 2]
        cycles.append(s)
        costs.append(loop[s] + loop[s + 1] - without)
        clean.append(without / 2)
        cpu_without = cpu[s - 1] + cpu[s + 2]
        cpu_costs.append(cpu[s] + cpu[s + 1] - cpu_without)
        cpu_clean.append(cpu_without / 2)
    if not costs:
        raise SystemExit(f"compare_snapshots: --paired {k} needs more steps (--steps)")
    cost, base = statistics.median(costs), statistics.mean(clean)
    print(f"\none run, a snapshot every {k} steps, wall time per step (loop_ms):")
    print("  " + " ".join(f"{loop[t]:.0f}" for t in sorted(loop)))
    print(f"cost per snapshot, {len(costs)} cycles (the two steps it touches less the two "
          f"beside them): median {cost:.1f} ms, mean {statistics.mean(costs):.1f} ms "
          f"{[round(c) for c in costs]}")
    print(f"steps without: {base:.1f} ms; a snapshot every step: {1 + cost / base:.3f}x "
          f"(median), {1 + statistics.mean(costs) / base:.3f}x (mean)")
    cpu_cost, cpu_base = statistics.median(cpu_costs), statistics.mean(cpu_clean)
    print("CPU per step, all ranks:")
    print("  " + " ".join(f"{cpu[t]:.0f}" for t in sorted(cpu)))
    print(f"CPU per snapshot: median {cpu_cost:.1f} ms, mean {statistics.mean(cpu_costs):.1f} ms "
          f"{[round(c) for c in cpu_costs]}")
    print(f"steps without: {cpu_base:.1f} ms of CPU; a snapshot every step: "
          f"{1 + cpu_cost / cpu_base:.3f}x (median), "
          f"{1 + statistics.mean(cpu_costs) / cpu_base:.3f}x (mean)")
    print("where it goes, per rank, ms more in step s / s+1 than beside them (medians): " +
          parts_of_cost(rows, cycles))
    snaps = [r["snapshot"] for r in rows if "snapshot" in r]
    if snaps:
        print(f"snapshot: blocking {statistics.median(s['blocking_ms'] for s in snaps):.1f} ms, "
              f"background CPU {statistics.median(s.get('write_cpu_ms', 0) for s in snaps):.1f} ms "
              f"(median of {len(snaps)})")


if __name__ == "__main__":
    main()
