#!/usr/bin/env python3
"""The checks at the end of scripts/chaos_nodes.sh's run (see its top).

Reads every launcher's log (the faults each agent raised, in its
`brigade launch: chaos fault N: ...` lines), the run directory's
incidents.jsonl, metrics.jsonl and checkpoints, and `brigade ettr RUN
--json`; writes OUT/report.json and a line per check; exits 1 when one
fails. The issue's criteria are checks here: the ETTR at least --min-ettr,
the failure model within --model-tolerance of it, every kind of
--require-kinds raised, no launcher left running, no checkpoint that does
not verify (the run keeps every one), and no recovery that redid more
steps than the snapshots allow.
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


# Names of --require-kinds (the chaos spec's) as the fault lines say them.
RAISED_AS = {"kill": "SIGKILL", "stop": "SIGSTOP", "partition": "partition",
             "kill-agent": "kill-agent"}
# A checkpoint or snapshot that did not verify when a restart looked at it.
UNVERIFIED = re.compile(r"brigade: skipping checkpoint |checkpoints verifies|"
                        r"not resuming from the in-memory snapshot: ")
RESTART = re.compile(r"restarting the workers as generation (\d+) .*?(from the in-memory snapshot "
                     r"of step (\d+))?$")
DISK_FALLBACK = re.compile(r"node 0: no in-memory snapshot to resume from \((.*)\); the newest "
                           r"disk checkpoint instead")
TIMEOUT_S = 300  # for each brigade subprocess: a hung one is a failure, not a hung check


def run_brigade(argv, failures, what):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        failures.append(f"{what} did not finish within {TIMEOUT_S} s")
        return None
    return r


def redone_steps(metrics_path):
    """The restarts metrics.jsonl shows (a step logged again or earlier):
    the highest step logged before each, the step the next generation
    resumed from; and the kept steps' training time (each step's last
    logging: its window on the loop's clock less its saves and evaluations,
    as the workers count it for the ETTR, elastic/incidents.h)."""
    restarts, kept, highest, previous = [], {}, -1, None
    with open(metrics_path) as f:
        for line in f:
            j = json.loads(line)
            if "step" not in j or "step_ms" not in j:
                continue
            step = j["step"]
            if previous is not None and step <= previous:
                restarts.append({"highest": highest, "resumed_from": step - 1,
                                 "redone": highest - (step - 1)})
            previous, highest = step, max(highest, step)
            b = j["breakdown"]  # brigade ettr refuses a row without one too
            kept[step] = max(0.0, b["step_ms"] - b["ckpt_ms"] - b["eval_ms"])
    return restarts, sum(kept.values()) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--brigade", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--node0-status", type=int, required=True)
    ap.add_argument("--hang", type=int, required=True)
    ap.add_argument("--wall-s", type=float, required=True)
    ap.add_argument("--replacements", type=int, required=True)
    ap.add_argument("--leftover", type=int, default=0,
                    help="launchers the harness found still running 60 s after node 0 ended")
    ap.add_argument("--min-ettr", type=float, default=0.95)
    ap.add_argument("--model-tolerance", type=float, default=0.03,
                    help="the most brigade ettr's predicted ETTR may differ from the run's")
    ap.add_argument("--model-mtbf", choices=["chaos", "realized"], default="chaos",
                    help="the MTBF the failure model is given: the chaos mode's mean, or the "
                         "run's own (training window over incidents), which a run of a minute "
                         "or two needs: its few faults come by chance, and their count, not "
                         "the model, decides its ETTR")
    ap.add_argument("--require-kinds", default="",
                    help="chaos kinds that must each have been raised, '+'-separated")
    ap.add_argument("--snapshot-every", type=int, default=1)
    a = ap.parse_args()
    failures = []
    report = {"wall_s": a.wall_s, "replacements": a.replacements, "leftover": a.leftover}
    if a.leftover:
        failures.append(f"{a.leftover} launcher(s) still ran 60 s after node 0 ended")

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
        r = run_brigade([a.brigade, "ckpt", "inspect", d], failures, f"ckpt inspect {d}")
        if r is None or r.returncode != 0:
            corrupted.append(os.path.basename(d))
    report["checkpoints_checked"] = checked
    report["checkpoints_corrupted"] = corrupted
    if checked == 0:
        failures.append(f"no committed checkpoint in {ckpt_dir}")
    if corrupted:
        failures.append(f"corrupted checkpoints: {corrupted}")
    # A checkpoint a restart skipped (or a snapshot it refused) is one that
    # did not verify then, even if retention deleted it since.
    logs = sorted(glob.glob(os.path.join(a.out, "logs", "machine-*.log")))
    for path in logs:
        with open(path, errors="replace") as f:
            for line in f:
                if UNVERIFIED.search(line):
                    failures.append(f"{os.path.basename(path)}: {line.strip()}")

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
    # A rejoin and a straggler episode (restart false) are records of the
    # run, not failures: no generation of their own, no fault behind them.
    failure_incidents = [i for i in incidents if i.get("restart", True)]
    report["incidents"] = collections.Counter(i["kind"] for i in failure_incidents)
    report["other_records"] = collections.Counter(
        i["kind"] for i in incidents if not i.get("restart", True))
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
    for kind in filter(None, a.require_kinds.split("+")):
        if kind not in RAISED_AS:
            failures.append(f"--require-kinds names '{kind}': the kinds are {sorted(RAISED_AS)}")
        elif not report["faults_raised"][RAISED_AS[kind]]:
            failures.append(f"no {kind} fault was raised (--require-kinds {a.require_kinds})")

    # Steps redone, from metrics.jsonl (not the incidents' own count): a
    # restart resumes within snapshot_every (+1, a step in flight) of the
    # highest step the job completed, unless it fell back to disk for a
    # reason other than the previous generation leaving no snapshot while
    # it had resumed from one (a fault during a recovery: the step that
    # generation resumed from is still assembled on every node).
    metrics = os.path.join(a.run, "metrics.jsonl")
    restarts, kept_s = ([], None)
    if os.path.exists(metrics):
        restarts, kept_s = redone_steps(metrics)
    else:
        failures.append(f"{metrics} is missing")
    resumed_snapshot, fallbacks = {}, []
    node0 = os.path.join(a.out, "logs", "machine-0.log")
    if os.path.exists(node0):
        with open(node0, errors="replace") as f:
            for line in f:
                m = RESTART.search(line.strip())
                if m:
                    resumed_snapshot[int(m.group(1))] = m.group(3) is not None
                m = DISK_FALLBACK.search(line)
                if m:
                    fallbacks.append(m.group(1))
    redone = [r for r in restarts if r["redone"] > a.snapshot_every + 1]
    report["restarts_redoing_steps"] = redone
    report["steps_redone"] = sum(r["redone"] for r in restarts)
    report["disk_fallbacks"] = fallbacks
    if len(redone) > len(fallbacks):
        failures.append(f"{len(redone)} restart(s) redid more than {a.snapshot_every + 1} steps "
                        f"({redone}), but node 0 fell back to disk {len(fallbacks)} time(s)")
    for why in fallbacks:
        m = re.search(r"recorded no snapshot part in generation (\d+)", why)
        if m and resumed_snapshot.get(int(m.group(1))) and "holds no copy" not in why:
            failures.append(f"generation {m.group(1)} resumed from a snapshot and left none, and "
                            f"the next went back to disk instead of to that snapshot ({why})")

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

    # ETTR: the agent's (kept training time over its wall time) and `brigade
    # ettr` against the failure model.
    if summary is None:
        failures.append("incidents.jsonl has no summary line")
    else:
        report["summary"] = summary
        # The agent's ETTR is kept training time over its wall time; the kept
        # time lies within the training window, which lies within the wall.
        ettr, kept = summary["ettr"], summary["productive_s"]
        window, wall = summary["training_s"], summary["wall_s"]
        if not 0 < ettr <= 1 or abs(ettr - kept / wall) > 1e-9:
            failures.append(f"ETTR {ettr} is not the kept {kept} s over the wall {wall} s")
        if not 0 < kept <= window <= wall:
            failures.append(f"kept {kept} s, training window {window} s and wall {wall} s are "
                            f"not in that order")
        # The kept time from the steps' own log: each step's last run.
        report["kept_s_from_metrics"] = kept_s
        if kept_s is not None and abs(kept_s - kept) > 0.02 * kept + 1:
            failures.append(f"the kept steps of metrics.jsonl took {kept_s:.1f} s, the summary "
                            f"says {kept:.1f} s")
        # The agent's wall within the harness's (which also counts the
        # launchers' start, whole seconds).
        if not a.wall_s - 30 <= wall <= a.wall_s + 2:
            failures.append(f"the summary's wall time {wall:.1f} s is not the run's "
                            f"{a.wall_s:.0f} s (the harness's clock)")
        if ettr < a.min_ettr:
            failures.append(f"ETTR {ettr:.3f} is below --min-ettr {a.min_ettr}")
    ettr_command = [a.brigade, "ettr", a.run, "--json"]
    if a.model_mtbf == "realized" and summary is not None and summary.get("incidents", 0) > 0:
        ettr_command += ["--mtbf-s", str(summary["training_s"] / summary["incidents"])]
    r = run_brigade(ettr_command, failures, "brigade ettr")
    if r is not None and r.returncode != 0:
        failures.append(f"brigade ettr failed: {r.stderr.strip()}")
    elif r is not None:
        report["ettr_model"] = json.loads(r.stdout)
        predicted = report["ettr_model"]["predicted_ettr"]
        if summary is not None and abs(predicted - summary["ettr"]) > a.model_tolerance:
            failures.append(f"the failure model predicts an ETTR of {predicted:.3f}, the run had "
                            f"{summary['ettr']:.3f}: more than {a.model_tolerance} apart")

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
