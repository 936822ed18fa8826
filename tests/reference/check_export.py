#!/usr/bin/python3
"""A distributed checkpoint exported to Hugging Face's layout, checked in PyTorch.

  check_export.py --brigade build/brigade --reftool build/brigade_reftool

Trains a small model for 3 steps as 2 data-parallel workers under ZeRO 3 (so
the parameters exist only as the ranks' shards), exports the checkpoint with
`brigade ckpt export --to hf`, loads the exported model.safetensors into the
PyTorch reference model, and compares its loss on random tokens with
Brigade's loss for the same file (brigade_reftool). Also checks config.json
carries the GPT-2 keys transformers reads. Exit 0 when they agree, 1 when
not, 2 when a tool fails.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402

CONFIG = """
[model]
n_layer = 2
n_head = 4
n_embd = 64
block_size = 32
vocab_size = 97
[train]
micro_batch = 2
steps = 3
[optim]
lr = 1e-2
[data]
synthetic = true
[parallel]
zero = 3
"""
BATCH, SEQ = 3, 32
LOSS_RTOL = 1e-5


def run(argv):
    print("$ " + " ".join(argv), flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        print(proc.stdout + proc.stderr, file=sys.stderr)
        sys.exit(2)
    return proc


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brigade", required=True)
    parser.add_argument("--reftool", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="brigade_check_export_") as tmp:
        config = os.path.join(tmp, "config.toml")
        with open(config, "w") as f:
            f.write(CONFIG)
        run_dir = os.path.join(tmp, "run")
        out = os.path.join(tmp, "hf")
        run([args.brigade, "train", "--nproc", "2", config, "--set", f'train.run_dir="{run_dir}"'])
        run([args.brigade, "ckpt", "export", "--to", "hf", out, run_dir])

        with open(os.path.join(out, "config.json")) as f:
            hf = json.load(f)
        missing = [k for k in ("model_type", "n_layer", "n_head", "n_embd", "n_positions",
                               "vocab_size") if k not in hf]
        if missing or hf["model_type"] != "gpt2":
            print(f"config.json lacks {missing} or is not gpt2: {hf}")
            return 1

        weights = os.path.join(out, "model.safetensors")
        model = torch_gpt.load_model(weights)
        tokens = np.random.default_rng(7).integers(0, 97, size=(BATCH, SEQ + 1)).astype("<i4")
        tokens_path = os.path.join(tmp, "tokens.bin")
        tokens.tofile(tokens_path)
        t = torch.from_numpy(tokens.astype(np.int64))
        with torch.no_grad():
            _, loss = model(t[:, :-1].contiguous(), t[:, 1:].contiguous())
        torch_loss = float(loss)

        result = os.path.join(tmp, "grads.safetensors")
        run([args.reftool, "grads", weights, tokens_path, result, "--batch", str(BATCH),
             "--seq", str(SEQ)])
        tensors, _ = torch_gpt.load_safetensors(result)
        brigade_loss = float(tensors["loss"][0])

    error = abs(torch_loss - brigade_loss) / abs(torch_loss)
    print(f"loss of the exported model: torch {torch_loss:.7f}, brigade {brigade_loss:.7f}, "
          f"relative difference {error:.2e} (limit {LOSS_RTOL:.0e})")
    return 0 if error <= LOSS_RTOL else 1


if __name__ == "__main__":
    sys.exit(main())
