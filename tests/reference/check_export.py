#!/usr/bin/python3
"""Distributed checkpoints exported to Hugging Face's layout, checked in PyTorch.

  check_export.py --brigade build/brigade --reftool build/brigade_reftool
                  [--layouts zero3,tp2,pp2]

For each layout it trains a small model for 3 steps as 2 workers on a tiny
byte-level dataset, so the parameters exist only as the ranks' pieces:

  zero3  dp 2 under ZeRO 3: each rank holds slices of every bucket;
  tp2    tp 2 with sequence parallelism: c_attn/c_fc split by columns,
         c_proj by rows, the vocabulary-parallel wte of vocab_size 257 padded
         to 258 rows (one padding row that must not reach the export);
  pp2    pp 2 under 1F1B: blocks [0, 2) on one stage, [2, 3) and the LM head
         on the other, wte on both.

It exports the checkpoint with `brigade ckpt export --to hf`, loads the
exported model.safetensors into the PyTorch reference model, and checks:

  - PyTorch's mean loss over the validation windows equals the validation
    loss `brigade train` computed at the end of the run, through the
    distributed model itself (every tp rank's shards, every stage), on the
    state it saved. This is what ties the export to the trained model: a
    column run, a row block, a stage's blocks or the padding put in the
    wrong place changes PyTorch's loss but not Brigade's.
  - Brigade's loss for the exported file (brigade_reftool, random tokens)
    equals PyTorch's: both read the file the same way.
  - config.json carries the GPT-2 keys transformers reads, with the whole
    model's values (n_layer 3, not a stage's; vocab_size 257, not tp's
    padded 258), as does the file's own metadata, and wte has 257 rows.

Each layout also prints how far three probes, bugs applied to the exported
tensors in Python (the tp halves of c_fc's columns swapped; blocks 0 and 2
swapped; a zero padding row exported first, shifting the vocabulary), would
move PyTorch's loss, and fails if any moves it by less than 10x the
tolerance: the check must be able to see such a bug.

All tool calls share one deadline of DEADLINE_S seconds (below ctest's
TIMEOUT, so a hang is reported here, with the tool's output, and its
processes are stopped); SIGTERM exits through Python's cleanup, which stops
the tool running and removes the temporary directory.

Exit 0 when all agree, 1 when not, 2 when a tool fails or the deadline passes.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402

# vocab_size 257: the byte tokenizer's 256 and one more, so tp 2 pads one row
# and the last real row (a token the data never holds) is not padding. Three
# layers, so pp 2 cuts them unevenly ([0, 2) and [2, 3) by cost).
MODEL = """
[model]
n_layer = 3
n_head = 4
n_embd = 64
block_size = 32
vocab_size = 257
[train]
micro_batch = 2
grad_accum = 2
steps = 3
eval_windows = 0
[optim]
lr = 1e-2
[data]
tokenizer = "byte"
"""
LAYOUTS = {
    "zero3": "[parallel]\nzero = 3\n",
    "tp2": "[parallel]\ntp = 2\nsequence_parallel = true\n",
    "pp2": "[parallel]\npp = 2\nschedule = \"1f1b\"\n",
}
BATCH, SEQ = 3, 32
LOSS_RTOL = 1e-5
PROBE_FACTOR = 10.0
# For every tool call together; tests/CMakeLists.txt gives ctest a TIMEOUT of
# 300 s, above it. A run takes a few seconds a layout on a loaded machine.
DEADLINE_S = 240
DEADLINE = time.monotonic() + DEADLINE_S
# How long a tool gets to stop its own processes after SIGTERM.
STOP_GRACE_S = 20


class ToolError(Exception):
    pass


def stop(proc):
    """SIGTERM to the tool, by its pid (`brigade train --nproc` stops its workers), then SIGKILL."""
    proc.terminate()
    try:
        proc.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def run(argv):
    print("$ " + " ".join(argv), flush=True)
    left = DEADLINE - time.monotonic()
    if left <= 0:
        raise ToolError(f"the {DEADLINE_S} s deadline passed before {' '.join(argv[:3])}")
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        raise ToolError(f"{argv[0]}: {e}")
    try:
        stdout, stderr = proc.communicate(timeout=left)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise ToolError(f"{' '.join(argv[:3])} still ran at the {DEADLINE_S} s deadline; stopped")
    except BaseException:  # SIGTERM's SystemExit, ^C: stop the tool, then unwind
        stop(proc)
        raise
    if proc.returncode != 0:
        raise ToolError(f"{' '.join(argv[:3])} exited with status {proc.returncode}\n"
                        f"--- stdout ---\n{stdout}--- stderr ---\n{stderr}")
    return stdout


def write_text(path):
    """About 16 KB of word salad: enough for 49 validation windows of 32."""
    rng = np.random.default_rng(3)
    words = ["the", "brigade", "passes", "buckets", "of", "water", "along", "a", "line",
             "to", "fire", "quick", "slow"]
    with open(path, "w") as f:
        f.write(" ".join(words[i] for i in rng.integers(0, len(words), size=3000)) + "\n")


def read_token_shard(path):
    """src/brigade/data/token_shard.h's format."""
    with open(path, "rb") as f:
        header = f.read(32)
        data = f.read()
    if header[:8] != b"BRGDTOK\0":
        raise ToolError(f"{path}: not a token shard")
    width = int.from_bytes(header[12:16], "little")
    count = int.from_bytes(header[16:24], "little")
    dtype = {1: "<u2", 2: "<u4"}[width]
    return np.frombuffer(data, dtype=dtype, count=count).astype(np.int64)


def validation_windows(tokens, seq):
    """train/evaluate.cc's windows: non-overlapping, each predicting its next token."""
    n = (len(tokens) - 1) // seq
    idx = np.stack([tokens[w * seq:(w + 1) * seq] for w in range(n)])
    targets = np.stack([tokens[w * seq + 1:(w + 1) * seq + 1] for w in range(n)])
    return torch.from_numpy(idx), torch.from_numpy(targets)


def torch_loss(tensors, config, idx, targets):
    model = torch_gpt.GPT(config)
    torch_gpt.load_state_from_numpy(model, tensors)
    with torch.no_grad():
        _, loss = model(idx, targets)
    return float(loss)


def swap_tp_halves_of_c_fc(tensors, config):
    """Rank 1's columns of every c_fc where rank 0's belong."""
    out = dict(tensors)
    for i in range(config["n_layer"]):
        for suffix in ("weight", "bias"):
            name = f"h.{i}.mlp.c_fc.{suffix}"
            half = out[name].shape[-1] // 2
            out[name] = np.concatenate([out[name][..., half:], out[name][..., :half]], axis=-1)
    return out


def swap_first_and_last_block(tensors, config):
    """The stages' blocks in the wrong order."""
    out = dict(tensors)
    last = config["n_layer"] - 1
    for name in list(tensors):
        if name.startswith("h.0."):
            other = f"h.{last}." + name[len("h.0."):]
            out[name], out[other] = tensors[other], tensors[name]
    return out


def padding_row_first(tensors, config):
    """tp's zero padding row exported as row 0 and the last real row dropped."""
    out = dict(tensors)
    wte = tensors["wte.weight"]
    out["wte.weight"] = np.concatenate([np.zeros_like(wte[:1]), wte[:-1]])
    return out


PROBES = (("the tp halves of c_fc swapped", swap_tp_halves_of_c_fc),
          ("blocks 0 and 2 swapped", swap_first_and_last_block),
          ("the padding row first", padding_row_first))
# The model MODEL describes, as the export must describe it.
EXPECTED = {"n_layer": 3, "n_head": 4, "n_embd": 64, "n_positions": 32, "vocab_size": 257}


def check_layout(name, brigade, reftool, tmp, data_dir):
    failures = []
    config_path = os.path.join(tmp, f"{name}.toml")
    with open(config_path, "w") as f:
        f.write(MODEL + f'dir = "{data_dir}"\n' + LAYOUTS[name])
    run_dir = os.path.join(tmp, f"run_{name}")
    out = os.path.join(tmp, f"hf_{name}")
    run([brigade, "train", "--nproc", "2", config_path, "--set", f'train.run_dir="{run_dir}"'])
    run([brigade, "ckpt", "export", "--to", "hf", out, run_dir])

    with open(os.path.join(out, "config.json")) as f:
        hf = json.load(f)
    wrong = {k: hf.get(k) for k, v in EXPECTED.items() if hf.get(k) != v}
    if wrong or hf.get("model_type") != "gpt2":
        failures.append(f"{name}: config.json has {wrong} (model_type {hf.get('model_type')}), "
                        f"not the trained model's {EXPECTED} (gpt2)")

    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if '"val_loss"' in line]
    if not rows:
        raise ToolError(f"{run_dir}/metrics.jsonl holds no val_loss")
    brigade_val = float(rows[-1]["val_loss"])

    weights = os.path.join(out, "model.safetensors")
    tensors, metadata = torch_gpt.load_safetensors(weights)
    config = torch_gpt.config_from_metadata(metadata)
    # The file's own config sizes the PyTorch model: padded, it would load a
    # padded wte and agree with itself.
    in_metadata = {("block_size" if k == "n_positions" else k): v for k, v in EXPECTED.items()}
    wrong = {k: config.get(k) for k, v in in_metadata.items() if config.get(k) != v}
    if wrong or tensors["wte.weight"].shape[0] != EXPECTED["vocab_size"]:
        failures.append(f"{name}: the file's metadata has {wrong} and wte "
                        f"{tensors['wte.weight'].shape}, not the trained model's {in_metadata} "
                        f"and {EXPECTED['vocab_size']} rows")
    idx, targets = validation_windows(read_token_shard(os.path.join(data_dir, "val.bin")),
                                      config["block_size"])
    torch_val = torch_loss(tensors, config, idx, targets)
    val_error = abs(torch_val - brigade_val) / abs(torch_val)
    print(f"[{name}] validation loss over {len(idx)} windows: brigade train {brigade_val:.7f}, "
          f"torch on the export {torch_val:.7f}, relative difference {val_error:.2e} "
          f"(limit {LOSS_RTOL:.0e})")
    if not val_error <= LOSS_RTOL:
        failures.append(f"{name}: torch's validation loss on the export {torch_val:.7f} is not "
                        f"brigade train's {brigade_val:.7f} (rel {val_error:.2e})")
    for probe, mutate in PROBES:
        moved = abs(torch_loss(mutate(tensors, config), config, idx, targets) - torch_val) / \
            abs(torch_val)
        print(f"[{name}]   an export with {probe} would be off by {moved:.1e}")
        if not moved >= PROBE_FACTOR * LOSS_RTOL:  # NaN fails too
            failures.append(f"{name}: an export with {probe} moves the loss by only {moved:.1e}, "
                            f"under {PROBE_FACTOR:g}x the tolerance: the check is too weak")

    rng = np.random.default_rng(7)
    tokens = rng.integers(0, config["vocab_size"], size=(BATCH, SEQ + 1)).astype("<i4")
    tokens_path = os.path.join(tmp, f"tokens_{name}.bin")
    tokens.tofile(tokens_path)
    t = torch.from_numpy(tokens.astype(np.int64))
    torch_random = torch_loss(tensors, config, t[:, :-1].contiguous(), t[:, 1:].contiguous())
    result = os.path.join(tmp, f"grads_{name}.safetensors")
    run([reftool, "grads", weights, tokens_path, result, "--batch", str(BATCH), "--seq", str(SEQ)])
    reftool_random = float(torch_gpt.load_safetensors(result)[0]["loss"][0])
    error = abs(torch_random - reftool_random) / abs(torch_random)
    print(f"[{name}] loss of the exported file on random tokens: torch {torch_random:.7f}, "
          f"brigade_reftool {reftool_random:.7f}, relative difference {error:.2e}")
    if not error <= LOSS_RTOL:
        failures.append(f"{name}: brigade_reftool's loss {reftool_random:.7f} on the export is "
                        f"not torch's {torch_random:.7f} (rel {error:.2e})")
    return failures


def main():
    # sys.exit raises SystemExit: run() stops the tool, the temporary
    # directory is removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brigade", required=True)
    parser.add_argument("--reftool", required=True)
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help=f"comma-separated, of {', '.join(LAYOUTS)} (default: all)")
    args = parser.parse_args()
    layouts = [x for x in args.layouts.split(",") if x]
    unknown = [x for x in layouts if x not in LAYOUTS]
    if unknown or not layouts:
        parser.error(f"--layouts {args.layouts}: unknown {unknown}; choose from "
                     f"{', '.join(LAYOUTS)}")
    failures = []
    try:
        with tempfile.TemporaryDirectory(prefix="brigade_check_export_") as tmp:
            text = os.path.join(tmp, "text.txt")
            write_text(text)
            data_dir = os.path.join(tmp, "data")
            run([args.brigade, "data", "prepare", text, "--tokenizer", "byte", "--out", data_dir])
            for name in layouts:
                failures += check_layout(name, args.brigade, args.reftool, tmp, data_dir)
    except ToolError as e:
        print(f"check_export: {e}", file=sys.stderr)
        return 2
    for failure in failures:
        print("MISMATCH " + failure)
    print(f"{len(layouts) - len({f.split(':')[0] for f in failures})} of {len(layouts)} layouts "
          f"agree")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
