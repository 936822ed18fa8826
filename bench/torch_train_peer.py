#!/usr/bin/python3
"""PyTorch's side of `brigade bench train`: the same model, batch and
optimizer, trained the way an ordinary PyTorch user would, timed the same way.

  torch_train_peer.py CONFIG.toml [--set section.key=value ...]
                      [--threads N] [--steps N] [--warmup N]

Prints one JSON line:
  {"impl": "pytorch", "tokens_per_s", "step_ms", "peak_rss_bytes", "threads", "params", ...}

A step is train.grad_accum micro-batches of (train.micro_batch, model.block_size)
random tokens, then gradient clipping at optim.grad_clip and one AdamW update
with Brigade's decay split. The learning rate is held at optim.lr: a schedule
changes no work, only numbers.
"""

import argparse
import json
import os
import resource
import sys
import time
import tomllib

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import torch_gpt  # noqa: E402


def parse_value(text):
    """A --set value is read as TOML (so 1024, 3e-4, true, "x" all work);
    anything TOML rejects is taken as a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def load_config(path, overrides):
    with open(path, "rb") as f:
        config = tomllib.load(f)
    for item in overrides:
        key, sep, value = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise SystemExit(f"--set {item!r}: expected section.key=value, e.g. model.block_size=1024")
        table = config
        for part in parts[:-1]:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise SystemExit(f"--set {item!r}: {part} is not a table in {path}")
        table[parts[-1]] = parse_value(value.strip())
    return config


def parse_recompute(value):
    """Brigade spells model.recompute "none" or "full"; a bool is taken too."""
    if value in (True, "full"):
        return True
    if value in (False, "none"):
        return False
    raise SystemExit(f'model.recompute must be "none" or "full", got {value!r}')


def require(config, section, key):
    try:
        return config[section][key]
    except KeyError:
        raise SystemExit(f"config lacks [{section}] {key}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        raise SystemExit("--steps and --threads must be >= 1, --warmup >= 0")

    config = load_config(args.config, args.set)
    model_config = {k: require(config, "model", k) for k in torch_gpt.CONFIG_KEYS}
    model_config["recompute"] = parse_recompute(config["model"].get("recompute", "none"))
    train = config.get("train", {})
    optim = config.get("optim", {})
    micro_batch = int(require(config, "train", "micro_batch"))
    grad_accum = int(train.get("grad_accum", 1))
    block_size = int(model_config["block_size"])
    vocab_size = int(model_config["vocab_size"])

    torch.set_num_threads(args.threads)
    torch.manual_seed(int(train.get("seed", 0)))

    model = torch_gpt.GPT(model_config)
    model.train()
    params = list(model.parameters())
    groups = torch_gpt.param_groups(model, float(optim.get("weight_decay", 0.0)),
                                    bool(optim.get("decay_position_embedding", False)))
    opt = torch.optim.AdamW(groups, lr=float(require(config, "optim", "lr")),
                            betas=(float(optim.get("beta1", 0.9)), float(optim.get("beta2", 0.95))),
                            eps=float(optim.get("eps", 1e-8)))
    grad_clip = float(optim.get("grad_clip", 0.0))

    # Tokens are drawn up front so the timed loop measures training alone; a
    # few distinct batches are enough to keep the work honest.
    pool = [torch.randint(0, vocab_size, (micro_batch, block_size + 1)) for _ in range(4)]

    def step(first_micro):
        opt.zero_grad(set_to_none=True)
        for m in range(grad_accum):
            batch = pool[(first_micro + m) % len(pool)]
            _, loss = model(batch[:, :-1], batch[:, 1:])
            (loss / grad_accum).backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        return float(loss)

    for s in range(args.warmup):
        step(s * grad_accum)
    start = time.perf_counter()
    for s in range(args.steps):
        last_loss = step((args.warmup + s) * grad_accum)
    elapsed_s = time.perf_counter() - start

    tokens_per_step = micro_batch * block_size * grad_accum
    print(json.dumps({
        "impl": "pytorch",
        "tokens_per_s": tokens_per_step * args.steps / elapsed_s,
        "step_ms": 1000.0 * elapsed_s / args.steps,
        # Linux reports ru_maxrss in KiB.
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "threads": args.threads,
        "params": model.num_params(),
        "tokens_per_step": tokens_per_step,
        "steps": args.steps,
        "warmup": args.warmup,
        "last_loss": last_loss,
        "torch_version": torch.__version__,
    }), flush=True)


if __name__ == "__main__":
    main()
