#!/usr/bin/python3
"""Where a pipeline's measured bubble comes from: a traced run replayed.

  replay_pipeline_trace.py RUN_DIR/trace.json [more traces...]

Reads the trace of a `brigade train --trace A:B` run with pipeline
parallelism alone (dp 1, tp 1: rank r is stage r) and, for each traced step,
takes each stage's compute passes in the order it ran them (forward,
backward, backward input, backward weight, each of a micro-batch and a model
chunk) with their measured durations. It then runs them again on paper, as
the schedule's simulator (src/brigade/schedule/simulate.h) does: each stage
in its own order, a forward waiting for the previous virtual stage's forward
of its micro-batch, a backward (or backward input) for the next virtual
stage's, transfers free. Printed per step and stage:

  measured  the step's span (first pass or wait of any stage to the last
            one's end) less the stage's compute: its idle time
  replay    the same from the replay with the step's own durations: what
            the schedule makes of exactly those compute times. measured -
            replay is what the executor and the transfers add (a receive
            posted late, a send that waits, the time data takes to move)
  median    the replay with every pass taking the median duration of its
            stage, kind and chunk over all traced steps: the schedule under this
            run's typical costs, one slow pass (a core taken by another
            process) no longer in it

and the median durations themselves: whether F = B = W, which the
schedule's theoretical bubble assumes, holds on this machine.
"""

import argparse
import json
import re
import statistics
import sys

PASS = re.compile(r"(forward|backward input|backward weight|backward) (\d+)$")
KIND = {"forward": "F", "backward input": "B", "backward weight": "W", "backward": "BW"}


def load(path):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X"]


def steps_of(events):
    """{step name: {stage: (span start, span end, [(kind, mb, chunk, ms)])}}."""
    # The ranks' tracks are those with steps (a trace the launcher marked
    # also has an incidents track); one rank per stage (pp only).
    pids = sorted({e["pid"] for e in events if e.get("cat") == "step"})
    out = {}
    for step in sorted({e["name"] for e in events if e["cat"] == "step" and
                        e["name"].startswith("step ")}, key=lambda s: int(s.split()[1])):
        stages = {}
        for stage, pid in enumerate(pids):
            spans = [e for e in events if e["pid"] == pid and e["name"] == step]
            if not spans:
                continue
            lo, hi = spans[0]["ts"], spans[0]["ts"] + spans[0]["dur"]
            mine = sorted((e for e in events if e["pid"] == pid and lo <= e["ts"] <= hi and
                           e["cat"] in ("compute", "bubble") and
                           (e["cat"] == "bubble" or PASS.match(e["name"]))),
                          key=lambda e: e["ts"])
            # The drain's wait is the losses' sum after the list: the list
            # itself ends with the last pass or send wait.
            mine = [e for e in mine if e["name"] != "wait drain"]
            passes = []
            for e in mine:
                m = PASS.match(e["name"]) if e["cat"] == "compute" else None
                if m:
                    passes.append((KIND[m.group(1)], int(m.group(2)),
                                   int((e.get("args") or {}).get("chunk", 0)), e["dur"] / 1000))
            if mine:
                stages[stage] = (mine[0]["ts"], max(e["ts"] + e["dur"] for e in mine), passes)
        if len(stages) == len(pids) and len(pids) > 1:
            out[step] = stages
    return out


def replay(passes, durations=None):
    """passes[s]: [(kind, mb, chunk, ms)]; durations[(s, kind, chunk)] overrides ms.
    Returns (step ms, [busy ms per stage]), or None if the order deadlocks."""
    p = len(passes)
    chunks = 1 + max(c for ps in passes for (_, _, c, _) in ps)
    last = p * chunks - 1
    done, pc, clock = {}, [0] * p, [0.0] * p
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while pc[s] < len(passes[s]):
                kind, mb, chunk, ms = passes[s][pc[s]]
                vs = chunk * p + s
                dep = None
                if kind == "F" and vs > 0:
                    dep = ("F", mb, vs - 1)
                elif kind in ("B", "BW") and vs < last:
                    dep = ("B", mb, vs + 1)
                if dep is not None and dep not in done:
                    break
                start = max(clock[s], done[dep] if dep else 0.0)
                clock[s] = start + (durations[(s, kind, chunk)] if durations else ms)
                done[("B" if kind == "BW" else kind, mb, vs)] = clock[s]
                pc[s] += 1
                progress = True
    if any(pc[s] < len(passes[s]) for s in range(p)):
        return None
    busy = [sum(durations[(s, k, c)] if durations else ms for (k, _, c, ms) in passes[s])
            for s in range(p)]
    return max(clock), busy


def pct(idle, span):
    return f"{100 * idle / span:5.1f}%" if span > 0 else "    -"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+")
    args = parser.parse_args()
    status = 0
    for path in args.traces:
        try:
            steps = steps_of(load(path))
        except (OSError, ValueError, KeyError) as e:
            print(f"{path}: not a readable trace.json ({e}); write one with "
                  "`brigade train ... --trace A:B`", file=sys.stderr)
            status = 1
            continue
        if not steps:
            print(f"{path}: no traced step with more than one stage", file=sys.stderr)
            status = 1
            continue
        costs = {}
        for stages in steps.values():
            for s, (_, _, passes) in stages.items():
                for kind, _, chunk, ms in passes:
                    costs.setdefault((s, kind, chunk), []).append(ms)
        medians = {k: statistics.median(v) for k, v in costs.items()}
        chunked = any(c > 0 for (_, _, c) in medians)
        print(f"\n{path}: median pass (ms) " + ", ".join(
            f"stage {s} {k}{f' chunk {c}' if chunked else ''} {medians[(s, k, c)]:.1f}"
            for (s, k, c) in sorted(medians)))
        print(f"{'step':<8} {'stage':>5} {'compute ms':>10} {'measured idle':>15} "
              f"{'replay idle':>15} {'median idle':>15}")
        totals = [[], [], []]
        for name, stages in steps.items():
            p = len(stages)
            passes = [stages[s][2] for s in range(p)]
            span = (max(stages[s][1] for s in range(p)) -
                    min(stages[s][0] for s in range(p))) / 1000
            own, typical = replay(passes), replay(passes, medians)
            if own is None or typical is None:
                print(f"{name}: the passes' order deadlocks on replay", file=sys.stderr)
                status = 1
                continue
            for s in range(p):
                busy = own[1][s]
                cells = [(span - busy, span), (own[0] - busy, own[0]),
                         (typical[0] - typical[1][s], typical[0])]
                for total, cell in zip(totals, cells):
                    total.append(cell[0] / cell[1])
                print(f"{name:<8} {s:>5} {busy:>10.1f} " + " ".join(
                    f"{idle:>7.1f} {pct(idle, span_)}" for idle, span_ in cells))
        print("mean over stages and steps: measured {:.1f}%, replay {:.1f}%, median {:.1f}%".format(
            *(100 * statistics.mean(t) for t in totals)))
    return status


if __name__ == "__main__":
    sys.exit(main())
