#!/usr/bin/env python3
"""The checks at the end of scripts/chaos_nodes.sh's run (see its top).

Reads every launcher's log (the faults each agent raised, in its
`brigade launch: chaos fault N: ...` lines), the run directory's
incidents.jsonl and checkpoints, and `brigade ettr RUN --json`; writes
OUT/report.json and a line per check; exits 1 when one fails.
"""
import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys

# The kind of incident each chaos kind makes (elastic/incidents.h).
INCIDENT_OF = {"SIGKILL": "crash", "SIGSTOP": "hang", "partition": "partition",
               "kill-agent": "node_lost"}
FAULT_LINE = re.compile(
    r"brigade launch: chaos fault \d+: (?:(SIGKILL|SIGSTOP) to worker rank \d+ \(pid \d+, "
    r"node (\d+), generation (\d+)\)|(partition|kill-agent) of node (\d+) \(generation (\d+)\))")


def raised_faults(log_dir):
    faults = []
    for path in sorted(glob.glob(os.path.join(log_dir, "machine-*.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                m = FAULT_LINE.search(line)
                if not m:
                    continue
                if m.group(1):
                    kind, node, gen = m.group(1), int(m.group(2)), int(m.group(3))
                else:
                    kind, node, gen = m.group(4), int(m.group(5)), int(m.group(6))
                faults.append({"kind": kind, "node": node, "generation": gen,
                               "machine": os.path.basename(path)[:-4]})
    return faults


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--brigade", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--node0-status", type=int, required=True)
    ap.add_argument("--hang", type=int, required=True)
    ap.add_argument("--wall-s", type=float, required=True)
    ap.add_argument("--replacements", type=int, required=True)
    a = ap.parse_args()
    failures = []
    report = {"wall_s": a.wall_s, "replacements": a.replacements}

    # No hang: node 0's launcher ended by itself, and the job succeeded.
    if a.hang:
        failures.append("hang: node 0's launcher did not end within the bound")
    elif a.node0_status != 0:
        failures.append(f"node 0's launcher exited {a.node0_status}, not 0")

    # Zero corrupted checkpoints: every committed step directory verifies.
    checked, corrupted = 0, []
    ckpt_dir = os.path.join(a.run, "checkpoints")
    for d in sorted(glob.glob(os.path.join(ckpt_dir, "step_*"))):
        if not re.fullmatch(r"step_\d+", os.path.basename(d)) or not os.path.isdir(d):
            continue
        checked += 1
        r = subprocess.run([a.brigade, "ckpt", "inspect", d], capture_output=True, text=True)
        if r.returncode != 0:
            corrupted.append(os.path.basename(d))
    report["checkpoints_checked"] = checked
    report["checkpoints_corrupted"] = corrupted
    if checked == 0:
        failures.append(f"no committed checkpoint in {ckpt_dir}")
    if corrupted:
        failures.append(f"corrupted checkpoints: {corrupted}")

    # One incident per generation in which faults were raised, of a kind
    # raised there: a fault raised while another's generation was already
    # failing is overtaken by it (one stop, one restart), so it makes none.
    faults = raised_faults(os.path.join(a.out, "logs"))
    report["faults_raised"] = collections.Counter(f["kind"] for f in faults)
    by_gen = collections.defaultdict(set)
    for f in faults:
        by_gen[f["generation"]].add(INCIDENT_OF[f["kind"]])
    incidents, summary = [], None
    path = os.path.join(a.run, "incidents.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                j = json.loads(line)
                if j.get("kind") == "summary":
                    summary = j
                else:
                    incidents.append(j)
    else:
        failures.append(f"{path} is missing")
    failure_incidents = [i for i in incidents if i["kind"] != "rejoin"]
    report["incidents"] = collections.Counter(i["kind"] for i in incidents)
    seen_gens = set()
    for i in failure_incidents:
        g = i["generation"]
        if g in seen_gens:
            failures.append(f"two incidents in generation {g}")
        seen_gens.add(g)
        if g not in by_gen:
            failures.append(f"incident of generation {g} ({i['kind']}: {i['what']}) with no "
                            f"fault raised in it")
        elif i["kind"] not in by_gen[g]:
            failures.append(f"incident of generation {g} is a {i['kind']}, but the faults "
                            f"raised there make {sorted(by_gen[g])}")
        if not i.get("injected"):
            failures.append(f"incident of generation {g} ({i['kind']}) is not marked injected")
    for g in sorted(by_gen):
        if g not in seen_gens:
            failures.append(f"faults raised in generation {g} ({sorted(by_gen[g])}) left no "
                            f"incident")
    if not faults:
        failures.append("no fault was raised")

    # Recovery per kind: fault to the first step after it, and its phases.
    per_kind = {}
    for i in failure_incidents:
        k = per_kind.setdefault(i["kind"], {"count": 0, "recovered": 0, "recovered_ms": [],
                                            "phases_ms": collections.defaultdict(list),
                                            "steps_lost": 0})
        k["count"] += 1
        if i.get("recovered_after_ms") is not None:
            k["recovered"] += 1
            k["recovered_ms"].append(i["recovered_after_ms"])
        for phase, ms in (i.get("recovery_ms") or {}).items():
            if ms is not None:
                k["phases_ms"][phase].append(ms)
        k["steps_lost"] += i.get("steps_lost") or 0
    for k in per_kind.values():
        r = k.pop("recovered_ms")
        k["recovered_mean_ms"] = sum(r) / len(r) if r else None
        k["phases_mean_ms"] = {p: sum(v) / len(v) for p, v in k.pop("phases_ms").items()}
    report["per_kind"] = per_kind

    # ETTR: the agent's (kept step time over its wall time) and `brigade
    # ettr` against the failure model.
    if summary is None:
        failures.append("incidents.jsonl has no summary line")
    else:
        report["summary"] = summary
        # The agent's ETTR is kept step time over its wall time; the kept
        # time lies within the training window, which lies within the wall.
        ettr, kept = summary["ettr"], summary["productive_s"]
        window, wall = summary["training_s"], summary["wall_s"]
        if not 0 < ettr <= 1 or abs(ettr - kept / wall) > 1e-9:
            failures.append(f"ETTR {ettr} is not the kept {kept} s over the wall {wall} s")
        if not 0 < kept <= window <= wall:
            failures.append(f"kept {kept} s, training window {window} s and wall {wall} s are "
                            f"not in that order")
    r = subprocess.run([a.brigade, "ettr", a.run, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"brigade ettr failed: {r.stderr.strip()}")
    else:
        report["ettr_model"] = json.loads(r.stdout)
        if summary is not None and abs(report["ettr_model"]["wall_ettr"] - summary["ettr"]) > 1e-9:
            failures.append(f"brigade ettr read the run's ETTR as "
                            f"{report['ettr_model']['wall_ettr']}, not {summary['ettr']}")

    report["failures"] = failures
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    for line in failures:
        print("FAILED:", line)
    print("chaos_nodes: " + ("ok" if not failures else f"{len(failures)} check(s) failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
