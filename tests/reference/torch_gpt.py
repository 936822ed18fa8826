"""PyTorch GPT-2 used as the ground truth for Brigade.

The reference test (check_against_torch.py) and the benchmark peer
(bench/torch_train_peer.py) both build their model from here, so the model
Brigade is judged against and the model it is raced against are the same one.

Weights use Hugging Face GPT-2 names and the Conv1D layout, (in, out), so a
file written by Brigade loads here untouched and vice versa. Safetensors is
read and written with json + numpy alone: the test must run on a bare Debian
Python with no extra packages.
"""

import json
import math
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

LAYER_NORM_EPS = 1e-5
CONFIG_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


# ----------------------------------------------------------------------------
# Safetensors


_DTYPE_TO_NUMPY = {
    "BOOL": np.dtype("bool"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
}


def _dtype_code(dtype):
    # Compare kind and width only: a big-endian array is still F32, and the
    # bytes are swapped on write.
    for code, candidate in _DTYPE_TO_NUMPY.items():
        if dtype.kind == candidate.kind and dtype.itemsize == candidate.itemsize:
            return code
    return None


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: array} to `path`; metadata values must be strings."""
    header = {}
    chunks = []
    offset = 0
    for name, value in tensors.items():
        array = np.asarray(value)
        code = _dtype_code(array.dtype)
        if code is None:
            raise ValueError(f"tensor {name!r}: dtype {array.dtype} has no safetensors code")
        data = np.ascontiguousarray(array, dtype=_DTYPE_TO_NUMPY[code]).tobytes()
        header[name] = {
            "dtype": code,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    if metadata:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"metadata {key!r}: keys and values must be strings")
        header["__metadata__"] = dict(metadata)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Aligning the data start to 8 bytes lets readers map tensors in place.
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for data in chunks:
            f.write(data)


def load_safetensors(path):
    """Returns ({name: numpy array}, metadata dict); checks every offset."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: {len(blob)} bytes is too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise ValueError(f"{path}: header length {header_len} runs past the end of the file")
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = memoryview(blob)[8 + header_len:]
    metadata = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, entry in header.items():
        dtype_code = entry["dtype"]
        if dtype_code not in _DTYPE_TO_NUMPY:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {dtype_code}")
        dtype = _DTYPE_TO_NUMPY[dtype_code]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(o) for o in entry["data_offsets"])
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not (0 <= begin <= end <= len(data)) or end - begin != expected:
            raise ValueError(
                f"{path}: tensor {name!r} offsets [{begin}, {end}) do not hold "
                f"{shape} of {dtype_code} ({expected} bytes) inside {len(data)} data bytes")
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape).copy()
    return tensors, metadata


def config_metadata(config):
    """The safetensors __metadata__ that tells Brigade the model's shape."""
    return {"config": json.dumps({k: int(config[k]) for k in CONFIG_KEYS})}


def config_from_metadata(metadata):
    return {k: int(v) for k, v in json.loads(metadata["config"]).items()}


# ----------------------------------------------------------------------------
# Model


class _Weight(nn.Module):
    """Holds one matrix so its name matches Hugging Face (wte.weight)."""

    def __init__(self, rows, cols):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, cols))


class _Affine(nn.Module):
    """Conv1D layout: weight is (in, out) so y = x @ weight + bias."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        # One addmm over all B*T rows: the shape a BLAS likes best.
        flat = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return flat.view(*x.shape[:-1], self.weight.shape[1])


class _LayerNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, LAYER_NORM_EPS)


class _Attention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd {n_embd} is not divisible by n_head {n_head}")
        self.n_head = n_head
        self.c_attn = _Affine(n_embd, 3 * n_embd)
        self.c_proj = _Affine(n_embd, n_embd)
        self._masks = {}

    def _causal_mask(self, t, device):
        key = (t, device)
        if key not in self._masks:
            self._masks[key] = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)
        return self._masks[key]

    def forward(self, x):
        b, t, c = x.shape
        hd = c // self.n_head
        qkv = self.c_attn(x)
        # (B, T, 3, nh, hd) -> (3, B, nh, T, hd): q, k, v in that order.
        q, k, v = qkv.view(b, t, 3, self.n_head, hd).permute(2, 0, 3, 1, 4)
        # Scaling q costs T*hd multiplies per head instead of T*T on the scores.
        scores = torch.matmul(q * (1.0 / math.sqrt(hd)), k.transpose(-2, -1))
        scores = scores.masked_fill(self._causal_mask(t, x.device), float("-inf"))
        y = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class _Mlp(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = _Affine(n_embd, 4 * n_embd)
        self.c_proj = _Affine(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class _Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = _LayerNorm(n_embd)
        self.attn = _Attention(n_embd, n_head)
        self.ln_2 = _LayerNorm(n_embd)
        self.mlp = _Mlp(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 with a tied LM head. `config` is a dict with CONFIG_KEYS and,
    optionally, "recompute" (checkpoint each block, as a PyTorch user would
    to save activation memory)."""

    def __init__(self, config):
        super().__init__()
        self.config = {k: int(config[k]) for k in CONFIG_KEYS}
        self.recompute = bool(config.get("recompute", False))
        c = self.config
        self.wte = _Weight(c["vocab_size"], c["n_embd"])
        self.wpe = _Weight(c["block_size"], c["n_embd"])
        self.h = nn.ModuleList(_Block(c["n_embd"], c["n_head"]) for _ in range(c["n_layer"]))
        self.ln_f = _LayerNorm(c["n_embd"])
        init_gpt2_(self)

    def forward(self, idx, targets=None):
        """idx, targets: (B, T) int64. Returns (logits (B, T, V), mean loss or None)."""
        b, t = idx.shape
        if t > self.config["block_size"]:
            raise ValueError(f"sequence length {t} exceeds block_size {self.config['block_size']}")
        # F.embedding, not wte.weight[idx]: its backward is a dedicated kernel,
        # about 1.6x faster here than the generic index_put.
        x = F.embedding(idx, self.wte.weight) + self.wpe.weight[:t]
        for block in self.h:
            if self.recompute and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.ln_f(x)
        logits = torch.matmul(x, self.wte.weight.t())
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(b * t, -1), targets.reshape(b * t))
        return logits, loss

    def num_params(self):
        return sum(p.numel() for p in self.parameters())


def parameter_names(config):
    """Every parameter name in Brigade's (and Hugging Face's) order."""
    names = ["wte.weight", "wpe.weight"]
    for i in range(int(config["n_layer"])):
        p = f"h.{i}."
        names += [p + "ln_1.weight", p + "ln_1.bias",
                  p + "attn.c_attn.weight", p + "attn.c_attn.bias",
                  p + "attn.c_proj.weight", p + "attn.c_proj.bias",
                  p + "ln_2.weight", p + "ln_2.bias",
                  p + "mlp.c_fc.weight", p + "mlp.c_fc.bias",
                  p + "mlp.c_proj.weight", p + "mlp.c_proj.bias"]
    return names + ["ln_f.weight", "ln_f.bias"]


@torch.no_grad()
def init_gpt2_(model, generator=None):
    """GPT-2's init: N(0, 0.02) for matrices and embeddings, the two residual
    projections shrunk by 1/sqrt(2*n_layer) so the residual stream's variance
    does not grow with depth; zero biases, identity LayerNorms."""
    residual_std = 0.02 / math.sqrt(2 * model.config["n_layer"])
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            p.normal_(0.0, residual_std, generator=generator)
        elif name.endswith(".weight") and p.dim() == 2:
            p.normal_(0.0, 0.02, generator=generator)
        elif "ln_" in name and name.endswith(".weight"):
            p.fill_(1.0)
        else:
            p.zero_()


def is_decayed(name, decay_position_embedding=False):
    """Brigade's AdamW decay rule: matmul weights and the token embedding
    (which is also the LM head); never biases or LayerNorm."""
    if name == "wpe.weight":
        return bool(decay_position_embedding)
    if name == "wte.weight":
        return True
    return name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight"))


def param_groups(model, weight_decay, decay_position_embedding=False):
    """The two torch.optim parameter groups for the decay split."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if is_decayed(name, decay_position_embedding) else no_decay).append(p)
    return [{"params": decay, "weight_decay": float(weight_decay)},
            {"params": no_decay, "weight_decay": 0.0}]


def state_to_numpy(model):
    return {name: p.detach().cpu().numpy().copy() for name, p in model.named_parameters()}


@torch.no_grad()
def load_state_from_numpy(model, tensors):
    """Copies every parameter from `tensors`; a missing or misshapen one is an error."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(tensors))
    if missing:
        raise ValueError(f"weights lack {len(missing)} parameters, e.g. {missing[:3]}")
    for name, p in params.items():
        value = torch.from_numpy(np.asarray(tensors[name]))
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(f"{name}: file has shape {tuple(value.shape)}, model wants {tuple(p.shape)}")
        p.copy_(value.to(p.dtype))


def load_model(path, dtype=torch.float32):
    """Builds a GPT from a safetensors file that carries its config."""
    tensors, metadata = load_safetensors(path)
    if "config" not in metadata:
        raise ValueError(f"{path}: no 'config' in __metadata__")
    model = GPT(config_from_metadata(metadata)).to(dtype)
    load_state_from_numpy(model, tensors)
    return model
