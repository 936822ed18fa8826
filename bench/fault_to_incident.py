#!/usr/bin/env python3
"""Time from an injected fault to its incident line, per fault kind.

Runs `brigade train --nproc 4` on a small model with one fault per trial
(kill, stop, skip, mismatch, sdc; on a random rank after a random step) and
reads the incident the launcher recorded (RUN_DIR/incidents.jsonl): whether
its line names the injected rank,
detected_after_ms (fault to detection) and evidence_ms (detection to the
root-cause line: the flight recorders gathered and read). Prints, per kind,
the median and the worst of each and of their sum, the time an operator
waits for the one line.

  python3 bench/fault_to_incident.py --build build --trials 5
"""
import argparse
import json
import os
import pathlib
import random
import signal
import statistics
import subprocess
import sys
import tempfile

CONFIG = """
[train]
micro_batch = 2
steps = 10
seed = 5
snapshot_every = 1
[data]
synthetic = true
[diag]
sdc_every = 1
[parallel]
timeout_s = 20
"""

KINDS = ["kill", "stop", "skip", "mismatch", "sdc"]


def trial(brigade, work, kind, rank, step):
    run = work / f"{kind}_{rank}_{step}_{random.getrandbits(32):08x}"
    config = work / "config.toml"
    config.write_text(CONFIG)
    inject = f"{kind}:rank={rank}:step={step}"
    # Its own session, so that a timeout stops the workers too.
    p = subprocess.Popen([brigade, "train", "--nproc", "4", str(config), "--set",
                          f'train.run_dir="{run}"', "--inject", inject],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        print(f"{inject}: no end within 300 s; trial left out", file=sys.stderr)
        return None
    if p.returncode != 0:
        print(f"{inject}: brigade exited {p.returncode}; trial left out:\n{err[-2000:]}",
              file=sys.stderr)
        return None
    lines = [json.loads(l) for l in (run / "incidents.jsonl").read_text().splitlines()]
    # The first failure: not the summary, nor a straggler episode (restart
    # false) a loaded machine may have written before it.
    incident = next(l for l in lines if l.get("kind") != "summary" and l.get("restart", True))
    cause = incident.get("cause") or incident.get("what") or ""
    return (incident["kind"], f"rank {rank} " in cause, incident["detected_after_ms"],
            incident.get("evidence_ms") or 0.0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kinds", default=",".join(KINDS))
    a = p.parse_args()
    random.seed(a.seed)
    brigade = str(pathlib.Path(a.build) / "brigade")
    rows = []
    with tempfile.TemporaryDirectory(prefix="brigade_fault_to_incident_") as tmp:
        work = pathlib.Path(tmp)
        for kind in a.kinds.split(","):
            detect, evidence, total, named, culprit = [], [], [], set(), 0
            for _ in range(a.trials):
                got = trial(brigade, work, kind, random.randrange(4), random.randrange(2, 7))
                if got is None:
                    continue
                recorded, right, d, e = got
                named.add(recorded)
                culprit += right
                detect.append(d)
                evidence.append(e)
                total.append(d + e)
            rows.append((kind, "/".join(sorted(named)), culprit, detect, evidence, total))
    print("| fault | recorded as | line names the rank | detect ms (median / max) | "
          "evidence ms (median / max) | fault to line ms (median / max) |")
    print("|---|---|---|---|---|---|")
    for kind, named, culprit, d, e, t in rows:
        if not d:
            print(f"| {kind} | - | no trial ended | | | |")
            continue
        f = lambda v: f"{statistics.median(v):.0f} / {max(v):.0f}"
        print(f"| {kind} | {named} | {culprit} of {len(d)} | {f(d)} | {f(e)} | {f(t)} |")


if __name__ == "__main__":
    main()
