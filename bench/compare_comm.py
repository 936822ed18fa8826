#!/usr/bin/python3
"""Brigade's collectives beside OpenMPI's and Gloo's, in one run on this machine.

  compare_comm.py [--build build] [--nproc 2] [--rounds 3] [--op all_reduce|send_recv] [--json]

Runs, one after the other (side by side they would fight over the cores),
and --rounds times in turn, keeping each side's best figures:
  - brigade bench comm --backend shm            (buffers in the process's heap)
  - brigade bench comm --backend shm --shared   (buffers in the shm segment,
                                                 as training's flat buffers)
  - brigade bench comm --backend gloo           (if the binary has it)
  - mpirun ... bench/mpi_allreduce_peer         (if it was built and mpirun exists)
  - bench/shm_floor_peer                        (4 KiB only: the least a small
                                                 all-reduce can cost between
                                                 these cores; see its header)
and prints one table of all-reduce bus bandwidth at 64 MiB and latency at
4 KiB, with the ratios of each shm run to MPI, to Gloo and to the floor.
With --op send_recv the same for point-to-point (every rank sends to the
next and receives from the previous at once; MPI_Isend/MPI_Irecv on MPI's
side): bandwidth at 1 MiB and 16 MiB, latency at 4 KiB, no floor.
Only the sizes the table needs are run: about half a minute per round.
Exits non-zero if a brigade run fails; a missing peer is reported and skipped.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
RUN_TIMEOUT_S = 600
LATENCY_BYTES = 4 << 10
# The sizes whose bandwidth the table shows, per op.
BANDWIDTH_BYTES = {"all_reduce": (64 << 20,), "send_recv": (1 << 20, 16 << 20)}


class RunError(Exception):
    pass


def run_lines(name, argv, op, sizes):
    """Runs one side and returns its rows of `op`, keyed by bytes."""
    print(f"$ {' '.join(argv)}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except FileNotFoundError as e:
        raise RunError(f"{name}: cannot start {argv[0]}: {e}")
    except subprocess.TimeoutExpired:
        raise RunError(f"{name}: ran past {RUN_TIMEOUT_S} s")
    if proc.returncode != 0:
        raise RunError(f"{name}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    rows = {}
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if row.get("op") == op:
            rows[row["bytes"]] = row
    for size in sizes:
        if size not in rows:
            raise RunError(f"{name}: no {op} row for {size} bytes in:\n{proc.stdout}")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(REPO_ROOT, "build"),
                        help="CMake build directory holding brigade and bench/mpi_allreduce_peer")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3,
                        help="run every side this many times, alternating; keep each side's best")
    parser.add_argument("--op", choices=sorted(BANDWIDTH_BYTES), default="all_reduce")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    brigade = os.path.join(args.build, "brigade")
    peer = os.path.join(args.build, "bench", "mpi_allreduce_peer")
    op = args.op
    bandwidth_sizes = BANDWIDTH_BYTES[op]
    all_sizes = (LATENCY_BYTES,) + bandwidth_sizes
    # Powers of 4 from 4 KiB reach 1, 16 and 64 MiB exactly; the sizes between are cheap.
    sizes = ["--min-bytes", str(LATENCY_BYTES), "--max-bytes", str(max(bandwidth_sizes))]
    bench = [brigade, "bench", "comm", "--nproc", str(args.nproc), "--json", "--ops", op] + sizes

    # (name, argv, sizes, required): a required side that fails fails the
    # comparison; an optional one is reported and left out.
    sides = [
        ("shm", bench + ["--backend", "shm"], None, True),
        ("shm-shared", bench + ["--backend", "shm", "--shared"], None, True),
        ("gloo", bench + ["--backend", "gloo"], None, False),
    ]
    mpirun = shutil.which("mpirun")
    if os.access(peer, os.X_OK) and mpirun:
        argv = [mpirun, "-np", str(args.nproc)]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        argv += ["--oversubscribe", peer, "--json", "--op", op] + sizes
        sides.append(("mpi", argv, None, False))
    else:
        print("compare_comm: skipping MPI: bench/mpi_allreduce_peer not built (no MPI found by "
              "CMake) or no mpirun on PATH", file=sys.stderr)
    floor_peer = os.path.join(args.build, "bench", "shm_floor_peer")
    if op != "all_reduce":
        pass  # the floor is that of a small all-reduce
    elif args.nproc > (os.cpu_count() or 1):
        print("compare_comm: skipping the floor: more processes than cores", file=sys.stderr)
    elif os.access(floor_peer, os.X_OK):
        sides.append(("floor", [floor_peer, "--json", "--nproc", str(args.nproc),
                                "--bytes", str(LATENCY_BYTES)], (LATENCY_BYTES,), False))

    # Rounds of every side in turn; each side keeps its best figures. On a
    # VM whose other tenants (and vCPU placement) change from second to
    # second, noise only ever slows a run down, and alternating the sides
    # gives each the same chances at a quiet moment.
    results = {}
    for _ in range(args.rounds):
        for name, argv, sizes, required in list(sides):
            try:
                rows = run_lines(name, argv, op, sizes or all_sizes)
            except RunError as e:
                if required:
                    print(f"compare_comm: {e}", file=sys.stderr)
                    return 1
                print(f"compare_comm: skipping {name}: {e}", file=sys.stderr)
                sides = [side for side in sides if side[0] != name]
                results.pop(name, None)
                continue
            best = results.setdefault(name, rows)
            for size, row in rows.items():
                if size not in best or row["time_us"] < best[size]["time_us"]:
                    best[size] = row

    def mib(size):
        return f"{size >> 20}MiB"

    summary = {
        name: dict({f"busbw_gbps_{mib(size)}": rows[size]["busbw_gbps"] if size in rows else None
                    for size in bandwidth_sizes},
                   latency_us_4KiB=rows[LATENCY_BYTES]["time_us"])
        for name, rows in results.items()
    }
    # Ratios > 1 mean shm is better: more bandwidth, less latency.
    ratios = {}
    for shm in ("shm", "shm-shared"):
        for peer_name in ("mpi", "gloo"):
            if peer_name not in summary or shm not in summary:
                continue
            mine, theirs = summary[shm], summary[peer_name]
            ratios[f"{shm}/{peer_name}"] = dict(
                {f"busbw_x_{mib(size)}": mine[f"busbw_gbps_{mib(size)}"]
                 / theirs[f"busbw_gbps_{mib(size)}"] for size in bandwidth_sizes},
                latency_x_faster=theirs["latency_us_4KiB"] / mine["latency_us_4KiB"])
    if "floor" in summary:
        # How close each side comes to what the cores allow (1.0 is the floor).
        for name in ("shm", "shm-shared", "mpi"):
            if name in summary:
                ratios[f"{name}/floor"] = dict(
                    {f"busbw_x_{mib(size)}": None for size in bandwidth_sizes},
                    latency_x_faster=summary["floor"]["latency_us_4KiB"]
                    / summary[name]["latency_us_4KiB"])
    if args.json:
        print(json.dumps({"nproc": args.nproc, "op": op, "dtype": "f32",
                          "results": summary, "ratios": ratios}))
        return 0

    def cell(value, width):
        return f"{'-':>{width}}" if value is None else f"{value:>{width}.3f}"

    print(f"{op}, f32, {args.nproc} processes")
    print(f"{'backend':<12}" + "".join(f" {'busbw GB/s @' + mib(size):>18}" for size in bandwidth_sizes)
          + f" {'latency us @4K':>16}")
    for name, row in summary.items():
        print(f"{name:<12}" + "".join(f" {cell(row[f'busbw_gbps_{mib(size)}'], 18)}"
                                      for size in bandwidth_sizes)
              + f" {row['latency_us_4KiB']:>16.2f}")
    if ratios:
        print(f"\n{'ratio':<16}" + "".join(f" {'busbw x @' + mib(size):>14}" for size in bandwidth_sizes)
              + f" {'latency x faster':>18}")
        for name, row in ratios.items():
            print(f"{name:<16}" + "".join(f" {cell(row[f'busbw_x_{mib(size)}'], 14)}"
                                          for size in bandwidth_sizes)
                  + f" {row['latency_x_faster']:>18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
