#!/usr/bin/python3
"""Races `brigade bench train` against the PyTorch peer on one config.

  compare_train.py CONFIG.toml [--set section.key=value ...] [--threads N]
                   [--steps N] [--warmup N] [--brigade build/brigade] [--json]
                   [--torch-coretype NAME] [--brigade-isa avx2|avx512]

Runs Brigade, then torch_train_peer.py, as separate processes one after the
other (side by side they would fight over the same cores), and prints both
with the ratios Brigade / PyTorch. Both MFUs are against the one peak
Brigade measured and names (peak_description: the machine's FMA peak, or
its measured sgemm when that is higher): same model, same FLOPs per token,
same denominator. It also prints the ceiling: the ratio any implementation
would reach against this PyTorch run if it ran every model FLOP at that
peak (1 / PyTorch's MFU), which says whether a target ratio is reachable on
this machine at all. Exits non-zero if either side fails.

--torch-coretype sets OPENBLAS_CORETYPE for the PyTorch peer alone (its
OpenBLAS may misdetect a CPU whose model a VM hides: give it its best, e.g.
SkylakeX or Haswell); --brigade-isa sets BRIGADE_CPU_ISA for Brigade alone
(avx2 runs Brigade's AVX2 level on an AVX-512 machine).
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
PEER = os.path.join(HERE, "torch_train_peer.py")
RUN_TIMEOUT_S = 3600
MIB = 1024 * 1024


class RunError(Exception):
    pass


def run_json(name, argv, env_overrides):
    """Runs one side with `env_overrides` added to (None: removed from) this
    process's environment, and returns the JSON object on the last line of
    stdout that parses as one (progress lines before it are allowed)."""
    env = dict(os.environ)
    for key, value in env_overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    shown = " ".join(f"{k}={v}" for k, v in env_overrides.items() if v is not None)
    print(f"$ {shown + ' ' if shown else ''}{' '.join(argv)}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    except FileNotFoundError as e:
        raise RunError(f"{name}: cannot start {argv[0]}: {e}")
    except subprocess.TimeoutExpired:
        raise RunError(f"{name}: ran past {RUN_TIMEOUT_S} s")
    if proc.returncode != 0:
        raise RunError(f"{name} exited with status {proc.returncode}\n"
                       f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}")
    for line in reversed(proc.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise RunError(f"{name} printed no JSON line\n--- stdout ---\n{proc.stdout}")


def need(result, name, key):
    value = result.get(key)
    if not isinstance(value, (int, float)):
        raise RunError(f"{name}'s JSON lacks a number for {key!r}: {json.dumps(result)}")
    return float(value)


def ratio(a, b):
    return a / b if b else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--brigade", default=os.path.join(REPO_ROOT, "build", "brigade"))
    parser.add_argument("--json", action="store_true", help="print the combined result as JSON")
    parser.add_argument("--torch-coretype", metavar="NAME",
                        help="OPENBLAS_CORETYPE for the PyTorch peer only (e.g. SkylakeX, Haswell)")
    parser.add_argument("--brigade-isa", choices=["avx2", "avx512"],
                        help="BRIGADE_CPU_ISA for Brigade only")
    args = parser.parse_args()

    # Each flag reaches its own side only; a variable already in the
    # environment still reaches both, as before.
    brigade_env = {"BRIGADE_CPU_ISA": args.brigade_isa} if args.brigade_isa else {}
    torch_env = {"OPENBLAS_CORETYPE": args.torch_coretype} if args.torch_coretype else {}

    common = ["--threads", str(args.threads), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    for item in args.set:
        common += ["--set", item]
    try:
        if not os.access(args.brigade, os.X_OK):
            raise RunError(f"{args.brigade}: no such executable; build it first "
                           f"(cmake --build build --target brigade) or pass --brigade PATH")
        brigade = run_json("brigade", [args.brigade, "bench", "train", args.config, "--json"] + common,
                           brigade_env)
        torch_peer = run_json("pytorch peer", [sys.executable, PEER, args.config] + common, torch_env)
        b_tps, t_tps = need(brigade, "brigade", "tokens_per_s"), need(torch_peer, "pytorch", "tokens_per_s")
        b_rss = need(brigade, "brigade", "peak_rss_bytes")
        t_rss = need(torch_peer, "pytorch", "peak_rss_bytes")
        b_mfu = need(brigade, "brigade", "mfu")
        b_gflops = need(brigade, "brigade", "achieved_gflops")
        peak_gflops = need(brigade, "brigade", "peak_gflops")
        peak_description = brigade.get("peak_description")
        if not isinstance(peak_description, str):
            raise RunError(f"brigade's JSON lacks peak_description (an older build?): "
                           f"{json.dumps(brigade)}")
    except RunError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1

    if brigade.get("params") != torch_peer.get("params"):
        # Same config should mean the same model; if not, the race is unfair.
        print(f"warning: parameter counts differ: brigade {brigade.get('params')}, "
              f"pytorch {torch_peer.get('params')}", file=sys.stderr)

    # PyTorch does the same work per token (Brigade's FLOPs per token), and
    # its MFU is against the same peak Brigade's is.
    flops_per_token = ratio(b_gflops * 1e9, b_tps)
    t_mfu = ratio(flops_per_token * t_tps, peak_gflops * 1e9)
    ratios = {"tokens_per_s": ratio(b_tps, t_tps), "peak_rss": ratio(b_rss, t_rss),
              "ceiling_at_peak": ratio(1.0, t_mfu)}
    combined = {"brigade": brigade, "pytorch": torch_peer, "ratios": ratios,
                "pytorch_mfu": t_mfu, "peak_gflops": peak_gflops,
                "peak_description": peak_description,
                "sgemm_peak_gflops": brigade.get("sgemm_peak_gflops"),
                "torch_coretype": args.torch_coretype, "brigade_isa": args.brigade_isa}
    if args.json:
        print(json.dumps(combined))
        return 0

    rows = [("brigade", brigade, b_mfu), ("pytorch", torch_peer, t_mfu)]
    print(f"{'impl':<8} {'tokens/s':>10} {'step ms':>9} {'peak RSS MiB':>13} {'MFU':>7} {'GFLOP/s':>8}")
    for name, result, mfu in rows:
        print(f"{name:<8} {result['tokens_per_s']:10.1f} {result['step_ms']:9.1f} "
              f"{result['peak_rss_bytes'] / MIB:13.1f} {100 * mfu:6.1f}% {mfu * peak_gflops:8.1f}")
    print(f"\nbrigade / pytorch: tokens/s x{ratios['tokens_per_s']:.2f}, "
          f"peak RSS x{ratios['peak_rss']:.2f}")
    print(f"MFU (both) is against Brigade's {peak_description}")
    print(f"brigade: {brigade.get('cpu', '?')}; GEMMs: {brigade.get('gemm_backend', '?')}"
          f"{'; BRIGADE_CPU_ISA=' + args.brigade_isa if args.brigade_isa else ''}")
    if args.torch_coretype:
        print(f"pytorch: OPENBLAS_CORETYPE={args.torch_coretype}")
    print(f"ceiling: every FLOP at that peak would be x{ratios['ceiling_at_peak']:.2f} "
          f"this PyTorch run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
