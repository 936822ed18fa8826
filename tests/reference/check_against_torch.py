#!/usr/bin/python3
"""Checks Brigade's model and optimizer against PyTorch.

  check_against_torch.py --tool build/brigade_reftool [--workdir DIR]
  check_against_torch.py --self-test

With --tool it writes random weights and tokens, asks brigade_reftool for the
loss, logits and every gradient, then for the losses of ten AdamW steps, and
compares each with torch in float32. Any mismatch, a missing tool or a tool
that fails ends the run with a non-zero exit and a table saying which tensor
is off and by how much.

With --self-test it checks the reference itself (no tool needed): torch_gpt's
forward against a deliberately naive transcription of the GPT-2 formulas, its
gradients against finite differences (gradcheck, float64), and the
safetensors writer against its reader.

Exit codes: 0 all agree, 1 a mismatch, 2 the tool is missing or failed.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402

# Small, but every dimension differs so a transposed or mis-split tensor cannot
# pass by accident; 97 is prime so no vocab padding or tiling hides an edge.
CONFIG = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 80, "vocab_size": 97}
BATCH = 3
# The full block_size, so every position embedding gets a gradient; longer
# than Brigade's 64-row attention query block, so the off-diagonal blocks and
# the masked diagonal block of a later tile are both checked.
SEQ = 80

LOSS_RTOL = 1e-5
LOGITS_RTOL = 1e-4  # of max |logits|
GRAD_RTOL = 1e-4    # of max |torch grad| of the same tensor
STEPS_RTOL = 1e-4

STEPS = 10
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95}
# Each variant targets one thing a 10-step loss curve would otherwise hide, and
# names a bug ("probe") whose effect on the losses is printed, so a reader sees
# the variant can catch it. Adam divides out a gradient's scale, so clipping
# shows only through how the scale varies between steps and through eps:
#  - clip 1.3 sits inside the range of gradient norms here (1.2-1.6), so
#    clipping switches on and off;
#  - clip 0.05 clips every step; eps 1e-5 makes the threshold itself visible
#    (with eps 1e-8, clipping at 0.05 and at 1.0 agree to 1e-5);
#  - at weight decay 0.1 a wrongly decayed wpe or bias moves the losses by
#    ~1e-5, under the tolerance; at 50 every wrong split moves them > 3e-3.
VARIANTS = (
    {"grad_clip": 1.3, "eps": 1e-8, "weight_decay": 0.1,
     "probe": ("skipped clipping", {"grad_clip": math.inf})},
    {"grad_clip": 0.05, "eps": 1e-5, "weight_decay": 0.1,
     "probe": ("clipped at 1.0 instead of 0.05", {"grad_clip": 1.0})},
    {"grad_clip": 1.3, "eps": 1e-8, "weight_decay": 50.0,
     "probe": ("also decayed wpe", {"decay_position_embedding": True})},
)
TOOL_TIMEOUT_S = 600


class ToolError(Exception):
    pass


def make_weights(config, seed):
    """Random weights that exercise every gradient: unlike GPT-2's init,
    LayerNorm scales are not 1 and biases are not 0, so a kernel that drops a
    bias or a gain term changes the answer."""
    gen = torch.Generator().manual_seed(seed)
    model = torch_gpt.GPT(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() == 2:
                p.copy_(0.02 * noise)
            elif "ln_" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif "ln_" in name:
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.02 * noise)
    return torch_gpt.state_to_numpy(model)


def make_tokens(config, batch, seq, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, config["vocab_size"], size=(batch, seq + 1), dtype=np.int64).astype("<i4")


def run_tool(argv):
    print("$ " + " ".join(argv), flush=True)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except FileNotFoundError as e:
        raise ToolError(f"cannot start {argv[0]}: {e}")
    except subprocess.TimeoutExpired:
        raise ToolError(f"{argv[0]} {argv[1]} ran past {TOOL_TIMEOUT_S} s")
    if proc.returncode != 0:
        raise ToolError(f"{argv[0]} {argv[1]} exited with status {proc.returncode}\n"
                        f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}")
    return proc


def torch_batch(tokens):
    t = torch.from_numpy(tokens.astype(np.int64))
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def torch_grads(weights, tokens, dtype):
    model = torch_gpt.GPT(CONFIG).to(dtype)
    torch_gpt.load_state_from_numpy(model, weights)
    idx, targets = torch_batch(tokens)
    logits, loss = model(idx, targets)
    loss.backward()
    grads = {name: p.grad.detach().to(torch.float64).numpy() for name, p in model.named_parameters()}
    return float(loss), logits.detach().to(torch.float64).numpy(), grads


def print_table(rows):
    """rows: (name, shape, ref_max, err, tol, floor, ok)."""
    header = f"{'tensor':<26} {'shape':<14} {'max|torch|':>11} {'max err':>10} " \
             f"{'err/max':>9} {'tol':>8} {'f32 floor':>9}  status"
    print(header)
    print("-" * len(header))
    for name, shape, ref_max, err, tol, floor, ok in rows:
        rel = err / ref_max if ref_max > 0 else (0.0 if err == 0 else math.inf)
        print(f"{name:<26} {str(list(shape)):<14} {ref_max:11.3e} {err:10.3e} "
              f"{rel:9.2e} {tol:8.0e} {floor:9.2e}  {'ok' if ok else 'MISMATCH'}")


def check_grads(tool, workdir, weights_path, tokens_path, weights, tokens):
    out_path = os.path.join(workdir, "grads.safetensors")
    run_tool([tool, "grads", weights_path, tokens_path, out_path,
              "--batch", str(BATCH), "--seq", str(SEQ)])
    try:
        got, _ = torch_gpt.load_safetensors(out_path)
    except (OSError, ValueError) as e:
        raise ToolError(f"tool wrote an unreadable {out_path}: {e}")

    loss32, logits32, grads32 = torch_grads(weights, tokens, torch.float32)
    # float64 is not the yardstick (the brief pins float32) but shows how much
    # of any error is float32 rounding that torch itself makes.
    loss64, logits64, grads64 = torch_grads(weights, tokens, torch.float64)

    failures = []
    rows = []

    def compare(name, want, floor_ref, tol, scale):
        if name not in got:
            failures.append(f"{name}: missing from the tool's output")
            rows.append((name, want.shape, float(np.abs(want).max()), math.inf, tol, 0.0, False))
            return
        have = got[name].astype(np.float64)
        if have.shape != want.shape:
            failures.append(f"{name}: tool shape {list(have.shape)}, torch {list(want.shape)}")
            rows.append((name, want.shape, float(np.abs(want).max()), math.inf, tol, 0.0, False))
            return
        ref_max = float(np.abs(want).max()) if scale is None else scale
        err = float(np.abs(have - want).max()) if have.size else 0.0
        if not np.all(np.isfinite(have)):
            err = math.inf
        floor = float(np.abs(want - floor_ref).max()) / ref_max if ref_max > 0 else 0.0
        ok = err <= tol * ref_max
        if not ok:
            failures.append(f"{name}: max abs error {err:.3e} > {tol:g} * {ref_max:.3e}")
        rows.append((name, want.shape, ref_max, err, tol, floor, ok))

    compare("loss", np.array([loss32]), np.array([loss64]), LOSS_RTOL, abs(loss32))
    compare("logits", logits32, logits64, LOGITS_RTOL, None)
    for name in torch_gpt.parameter_names(CONFIG):
        compare("grad." + name, grads32[name], grads64[name], GRAD_RTOL, None)

    for name, value in got.items():
        if value.dtype != np.float32:
            failures.append(f"{name}: tool wrote {value.dtype}, expected float32")
    expected = {"loss", "logits"} | {"grad." + n for n in torch_gpt.parameter_names(CONFIG)}
    extra = sorted(set(got) - expected)
    if extra:
        print(f"note: tool wrote {len(extra)} tensors the test ignores: {extra[:5]}")

    print(f"\n[grads] loss torch {loss32:.7f}, tool {float(got['loss'].reshape(-1)[0]) if 'loss' in got else float('nan'):.7f}")
    print_table(rows)
    return failures


def torch_losses(weights, tokens, grad_clip, eps, weight_decay, decay_position_embedding=False):
    """Ten AdamW steps on one batch; returns (losses, grad norms, clipped?)."""
    model = torch_gpt.GPT(CONFIG)
    torch_gpt.load_state_from_numpy(model, weights)
    groups = torch_gpt.param_groups(model, weight_decay, decay_position_embedding)
    opt = torch.optim.AdamW(groups, lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=eps)
    idx, targets = torch_batch(tokens)
    losses, norms, clipped = [], [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, loss = model(idx, targets)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
        losses.append(float(loss))
        norms.append(norm)
        clipped.append(grad_clip / (norm + 1e-6) < 1.0)
        opt.step()
    return losses, norms, clipped


def check_steps(tool, workdir, weights_path, tokens_path, weights, tokens, variant):
    clip, eps, wd = variant["grad_clip"], variant["eps"], variant["weight_decay"]
    label = f"clip {clip:g} eps {eps:g} wd {wd:g}"
    out_path = os.path.join(workdir, f"steps_clip{clip:g}_eps{eps:g}_wd{wd:g}.json")
    run_tool([tool, "steps", weights_path, tokens_path, out_path,
              "--batch", str(BATCH), "--seq", str(SEQ), "--steps", str(STEPS),
              "--lr", f"{ADAMW['lr']:g}", "--weight-decay", f"{wd:g}",
              "--beta1", f"{ADAMW['beta1']:g}", "--beta2", f"{ADAMW['beta2']:g}",
              "--eps", f"{eps:g}", "--grad-clip", f"{clip:g}"])
    try:
        with open(out_path) as f:
            got = [float(x) for x in json.load(f)["losses"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ToolError(f"tool wrote an unreadable {out_path}: {e}")

    settings = {"grad_clip": clip, "eps": eps, "weight_decay": wd}
    want, norms, clipped = torch_losses(weights, tokens, **settings)
    probe_name, probe_change = variant["probe"]
    probed, _, _ = torch_losses(weights, tokens, **{**settings, **probe_change})
    sensitivity = max(abs(a - b) / abs(b) for a, b in zip(probed, want))

    failures = []
    if len(got) != STEPS:
        failures.append(f"steps ({label}): tool wrote {len(got)} losses, expected {STEPS}")
    print(f"\n[steps] AdamW lr {ADAMW['lr']:g} {label}: clipping active in {sum(clipped)} of "
          f"{STEPS} steps; a tool that {probe_name} would be off by up to {sensitivity:.1e} (rel)")
    if sensitivity < 10 * STEPS_RTOL:
        print(f"warning: that is under 10x the tolerance {STEPS_RTOL:g}, so such a bug may pass")
    header = f"{'step':>4} {'torch loss':>12} {'tool loss':>12} {'rel err':>9} {'grad norm':>10} clipped  status"
    print(header)
    print("-" * len(header))
    for step in range(STEPS):
        have = got[step] if step < len(got) else math.nan
        rel = abs(have - want[step]) / abs(want[step])
        ok = rel <= STEPS_RTOL  # NaN compares false, so a NaN loss fails
        if not ok:
            failures.append(f"steps ({label}) step {step}: loss {have!r} vs torch "
                            f"{want[step]:.7f}, rel err {rel:.2e} > {STEPS_RTOL:g}")
        print(f"{step:>4} {want[step]:12.7f} {have:12.7f} {rel:9.2e} {norms[step]:10.4f} "
              f"{'yes' if clipped[step] else 'no':>7}  {'ok' if ok else 'MISMATCH'}")
    return failures


def run_against_tool(tool, workdir, seed):
    if os.sep not in tool and shutil.which(tool):
        tool = shutil.which(tool)
    if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
        raise ToolError(f"{tool}: no such executable; build the brigade_reftool target first "
                        f"(cmake --build build --target brigade_reftool)")
    tool = os.path.abspath(tool)
    os.makedirs(workdir, exist_ok=True)

    weights = make_weights(CONFIG, seed)
    tokens = make_tokens(CONFIG, BATCH, SEQ, seed + 1)
    weights_path = os.path.join(workdir, "weights.safetensors")
    tokens_path = os.path.join(workdir, "tokens.i32")
    torch_gpt.save_safetensors(weights_path, weights, torch_gpt.config_metadata(CONFIG))
    tokens.tofile(tokens_path)
    print(f"config {json.dumps(CONFIG)}, batch {BATCH}, seq {SEQ}, seed {seed}; files in {workdir}")

    failures = check_grads(tool, workdir, weights_path, tokens_path, weights, tokens)
    for variant in VARIANTS:
        failures += check_steps(tool, workdir, weights_path, tokens_path, weights, tokens, variant)
    return failures


# ----------------------------------------------------------------------------
# Self-test of the reference


def naive_loss(config, weights, idx, targets):
    """GPT-2 transcribed formula by formula, with loops where torch_gpt
    reshapes, so a wrong permute or split there shows up as a difference."""
    c, nh = config["n_embd"], config["n_head"]
    hd = c // nh
    b, t = idx.shape

    def layer_norm(x, w, bias):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * w + bias

    def gelu(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    x = weights["wte.weight"][idx] + weights["wpe.weight"][torch.arange(t)]
    for i in range(config["n_layer"]):
        p = lambda n: weights[f"h.{i}.{n}"]  # noqa: E731
        h = layer_norm(x, p("ln_1.weight"), p("ln_1.bias"))
        qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = qkv[..., :c], qkv[..., c:2 * c], qkv[..., 2 * c:]
        y = torch.zeros_like(h)
        for head in range(nh):
            cols = slice(head * hd, (head + 1) * hd)
            for s in range(t):
                scores = (k[:, :s + 1, cols] @ q[:, s, cols].unsqueeze(-1)).squeeze(-1) / math.sqrt(hd)
                probs = torch.exp(scores - scores.max(-1, keepdim=True).values)
                probs = probs / probs.sum(-1, keepdim=True)
                y[:, s, cols] = (probs.unsqueeze(-1) * v[:, :s + 1, cols]).sum(1)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = layer_norm(x, p("ln_2.weight"), p("ln_2.bias"))
        x = x + gelu(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias")) @ p("mlp.c_proj.weight") \
            + p("mlp.c_proj.bias")
    x = layer_norm(x, weights["ln_f.weight"], weights["ln_f.bias"])
    logits = x @ weights["wte.weight"].T
    logz = torch.logsumexp(logits, -1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (logz - picked).mean(), logits


def self_test(workdir):
    failures = []
    config = {"n_layer": 2, "n_head": 2, "n_embd": 8, "block_size": 6, "vocab_size": 11}
    weights = make_weights(config, seed=3)
    tokens = make_tokens(config, 2, 5, seed=4)
    idx, targets = torch_batch(tokens)

    model = torch_gpt.GPT(config).double()
    torch_gpt.load_state_from_numpy(model, weights)
    logits, loss = model(idx, targets)
    w64 = {k: torch.from_numpy(v).double() for k, v in weights.items()}
    naive, naive_logits = naive_loss(config, w64, idx, targets)
    err = max(abs(float(loss - naive)), float((logits - naive_logits).abs().max()))
    print(f"forward vs naive transcription (float64): max abs diff {err:.2e}")
    if err > 1e-12:
        failures.append(f"torch_gpt forward differs from the naive formulas by {err:.2e}")

    names = [n for n, _ in model.named_parameters()]
    if names != torch_gpt.parameter_names(config):
        failures.append("named_parameters order differs from parameter_names()")
    params = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    originals = dict(model.named_parameters())

    # gradcheck needs the loss as a function of the parameters; torch 1.13's
    # functional_call is still private, so swap the tensors in and back out.
    def loss_of_params(*flat):
        for name, value in zip(names, flat):
            owner, attr = name.rsplit(".", 1)
            model.get_submodule(owner)._parameters[attr] = value
        try:
            return model(idx, targets)[1]
        finally:
            for name in names:
                owner, attr = name.rsplit(".", 1)
                model.get_submodule(owner)._parameters[attr] = originals[name]

    ok = torch.autograd.gradcheck(loss_of_params, tuple(params), eps=1e-6, atol=1e-7, rtol=1e-5,
                                  raise_exception=False)
    print(f"gradcheck of every parameter (float64): {'ok' if ok else 'FAILED'}")
    if not ok:
        failures.append("torch_gpt gradients fail gradcheck")

    # Safetensors: every dtype the tool may use, an empty tensor, a scalar
    # shape, metadata, and a header that needs padding.
    path = os.path.join(workdir, "roundtrip.safetensors")
    blobs = {"a.f32": np.arange(7, dtype=np.float32).reshape(7, 1),
             "b.i32": np.array([[-1, 2], [3, 2 ** 31 - 1]], dtype=np.int32),
             "c.f64": np.array([math.pi], dtype=np.float64),
             "d.empty": np.zeros((0, 3), dtype=np.float32),
             "e.i64": np.array(5, dtype=np.int64),
             "f.bigendian": np.arange(3, dtype=">f4")}
    meta = torch_gpt.config_metadata(CONFIG)
    torch_gpt.save_safetensors(path, blobs, meta)
    back, back_meta = torch_gpt.load_safetensors(path)
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
    same = back.keys() == blobs.keys() and all(
        back[k].shape == v.shape and np.array_equal(back[k], v) for k, v in blobs.items())
    if not same or back_meta != meta or header_len % 8 or back["f.bigendian"].dtype != np.float32:
        failures.append("safetensors round trip changed the data, metadata or alignment")
    if torch_gpt.config_from_metadata(back_meta) != CONFIG:
        failures.append("config metadata does not round-trip")
    print(f"safetensors round trip: {'ok' if same and back_meta == meta else 'FAILED'}")

    groups = torch_gpt.param_groups(torch_gpt.GPT(CONFIG), 0.1)
    decayed = {n for n in torch_gpt.parameter_names(CONFIG) if torch_gpt.is_decayed(n)}
    want = {"wte.weight"} | {f"h.{i}.{s}" for i in range(CONFIG["n_layer"]) for s in
                             ("attn.c_attn.weight", "attn.c_proj.weight",
                              "mlp.c_fc.weight", "mlp.c_proj.weight")}
    if decayed != want or len(groups[0]["params"]) != len(want):
        failures.append(f"decay split is wrong: {sorted(decayed ^ want)}")
    if not torch_gpt.is_decayed("wpe.weight", decay_position_embedding=True):
        failures.append("decay_position_embedding=true does not decay wpe")
    print(f"decay split: {len(want)} decayed tensors, wpe only on request")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--tool", help="path to brigade_reftool")
    mode.add_argument("--self-test", action="store_true", help="check the reference itself")
    parser.add_argument("--workdir", help="keep inputs and outputs here (default: a temp dir, "
                                          "removed on success)")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    workdir = args.workdir or tempfile.mkdtemp(prefix="brigade_ref_")
    os.makedirs(workdir, exist_ok=True)
    try:
        failures = self_test(workdir) if args.self_test else \
            run_against_tool(args.tool, workdir, args.seed)
    except ToolError as e:
        print(f"\nFAIL: {e}", file=sys.stderr)
        print(f"inputs kept in {workdir}", file=sys.stderr)
        return 2

    if failures:
        print(f"\nFAIL: {len(failures)} mismatches", file=sys.stderr)
        for line in failures:
            print("  " + line, file=sys.stderr)
        print(f"inputs and outputs kept in {workdir}", file=sys.stderr)
        return 1
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nPASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
