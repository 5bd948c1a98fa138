"""packpipe's cost model of a trainer's own torch model.

The planner needs a cost model even without a pipeline: it cuts every global batch into
micro-batches by their predicted time and memory. :func:`describe_model` reads what the cost model
needs from an ``nn.Module`` (the model file's fields: layers, hidden, heads, key/value heads, head
width, FFN width, gated MLP, vocabulary, bytes per parameter) and :func:`cost_model` builds the
cost model from it on a device (a preset name such as "H100-80GB", a device file, or a dict of its
fields). Whatever it cannot tell, it says so and names the argument that supplies it::

    cm = pt.cost_model(model, "A100-80GB")                  # analytic, calibrated by PlanLoader (default)
    cm = pt.cost_model(model, "A100-80GB", heads=16)         # what the module does not say
    cm = pt.cost_model(model, "A100-80GB", profiles=["block.profile.json"])   # measured (packpipe profile)

How it reads a module: the transformer layers are the largest ``nn.ModuleList`` (or
``nn.Sequential``) of modules of one class; the token embedding is the ``nn.Embedding`` tied to (or
as wide as the output of) an ``nn.Linear`` LM head, else the one with the most rows not named for
positions (its rows: the vocabulary; its width: hidden); heads (and key/value heads, head width)
come from attributes of the layer's submodules or the model's ``config`` under the usual names
(``num_heads``, ``n_head``, ``num_attention_heads``, ``heads``, ``nhead``; ``num_key_value_heads``,
``kv_heads``, ``n_kv_heads``; ``head_dim``), ``nn.MultiheadAttention`` included; the FFN width is
the input width of the layer's ``nn.Linear`` that maps back to hidden from another width (the MLP's
down projection), gated when two projections (or one of twice the width) lead up to it; bytes per
parameter from the parameters' dtype. ``model.json`` is documented in docs/guide.md.
"""
from __future__ import annotations

import json
import os
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

import packpipe
from packpipe import _check

_HEAD_NAMES = ("num_heads", "n_heads", "n_head", "num_attention_heads", "heads", "nhead", "num_attn_heads")
_KV_NAMES = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "kv_heads", "num_query_groups")
_HEAD_DIM_NAMES = ("head_dim", "head_size", "kv_channels")


class ModelDescriptionError(ValueError):
    """describe_model could not tell a field of the model file from the module."""


def _fail(model: nn.Module, what: str, argument: str, detail: str = "") -> None:
    raise ModelDescriptionError(f"describe_model: cannot tell {what} of {type(model).__name__}{detail}: pass "
                                f"{argument}")


def _stacks(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """(name, container) of every ModuleList / Sequential of modules of one class that hold parameters."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) > 0:
            kinds = {type(c) for c in m}
            if len(kinds) == 1 and any(True for _ in m.parameters()):
                out.append((name, m))
    return out


def _params(m: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())


def _layer_stack(model: nn.Module, layers) -> Tuple[Optional[str], Optional[nn.Module]]:
    stacks = _stacks(model)
    if not stacks:
        return None, None
    stacks.sort(key=lambda s: -_params(s[1]))
    name, top = stacks[0]
    others = [(n, s) for n, s in stacks[1:] if not n.startswith(name + ".") and not name.startswith(n + ".")
              and type(s[0]) is not type(top[0])]
    if others and layers is None and _params(others[0][1]) >= 0.5 * _params(top):
        n2, s2 = others[0]
        raise ModelDescriptionError(
            f"describe_model: {type(model).__name__} has several stacks of layers: '{name}' ({len(top)} x "
            f"{type(top[0]).__name__}) and '{n2}' ({len(s2)} x {type(s2[0]).__name__}); pass layers= (and, for an "
            "encoder-decoder model, arch='encoder_decoder' with layers=(encoder, decoder))")
    return name, top


def _token_embedding(model: nn.Module) -> Optional[nn.Embedding]:
    """The token embedding: the nn.Embedding that an nn.Linear's weight is tied to or that has as many
    rows as an nn.Linear has outputs (the LM head's vocabulary), then one not named for positions,
    then the one with the most rows."""
    embeddings = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Embedding)]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]

    def rank(item):
        name, e = item
        head = any(l.weight is e.weight or l.out_features == e.num_embeddings for l in linears)
        positional = any(k in name.lower().rsplit(".", 1)[-1] for k in ("pos", "wpe"))
        return (not head, positional, -e.num_embeddings)
    return min(embeddings, key=rank)[1] if embeddings else None


def max_positions(model: nn.Module) -> Tuple[Optional[int], str]:
    """The most positions `model` can take, and where that was read: a config's or the module's
    max_position_embeddings / n_positions / max_positions / max_seq_len / block_size, else the rows of a
    learned position embedding (an nn.Embedding named for positions: pos, wpe). (None, "") when it
    does not say (rotary positions, say)."""
    model = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    names = ("max_position_embeddings", "n_positions", "max_positions", "max_seq_len", "block_size")
    for owner, label in ((getattr(model, "config", None), "config."), (model, "")):
        for n in names:
            v = getattr(owner, n, None) if owner is not None else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v, f"{type(model).__name__}.{label}{n}"
    token = _token_embedding(model)
    for name, m in model.named_modules():
        if isinstance(m, nn.Embedding) and m is not token and \
                any(k in name.lower().rsplit(".", 1)[-1] for k in ("pos", "wpe")):
            return int(m.num_embeddings), f"{type(model).__name__}.{name} (a position embedding of {m.num_embeddings} rows)"
    return None, ""


def _find_int(modules, names) -> Optional[int]:
    for m in modules:
        for n in names:
            v = getattr(m, n, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def describe_model(model: nn.Module, *, arch: Optional[str] = None, layers: Union[int, Tuple[int, int], None] = None,
                   hidden: Optional[int] = None, heads: Optional[int] = None, kv_heads: Optional[int] = None,
                   head_dim: Optional[int] = None, ffn: Optional[int] = None, gated_mlp: Optional[bool] = None,
                   vocab: Optional[int] = None, dtype: Optional[torch.dtype] = None,
                   name: Optional[str] = None) -> Dict[str, Any]:
    """The model file (a dict: the fields of ``CostModel(model=<file.json>)``) of `model`: every field
    read from the module unless given; ModelDescriptionError (a ValueError) naming the argument when
    the module does not say. ``layers``: the transformer layers (decoder-only), or (encoder,
    decoder) with ``arch='encoder_decoder'``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"describe_model: model must be a torch.nn.Module, found {type(model).__name__}")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    where = "describe_model"
    arch = _check.one_of(where, "arch", arch or "decoder_only", ("decoder_only", "encoder_decoder"))
    for field, value in (("hidden", hidden), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim),
                         ("ffn", ffn), ("vocab", vocab)):
        if value is not None:
            _check.integer(where, field, value, 1, 2 ** 31 - 1)
    if isinstance(layers, tuple):
        for k, n in enumerate(layers):
            _check.integer(where, f"layers[{k}]", n, 1, 2 ** 31 - 1)
    elif layers is not None:
        _check.integer(where, "layers", layers, 1, 2 ** 31 - 1)
    if gated_mlp is not None:
        _check.boolean(where, "gated_mlp", gated_mlp)
    if dtype is not None:
        _check.instance(where, "dtype", dtype, torch.dtype, "a torch dtype")
    if name is not None and not (isinstance(name, str) and name.strip()):
        raise ValueError(f"{where}: name must be a non-empty str, found {name!r}")
    stack_name, stack = _layer_stack(model, layers)
    block = stack[0] if stack is not None else None
    config = getattr(model, "config", None)
    spec: Dict[str, Any] = {"name": name or type(model).__name__, "arch": arch}
    if arch == "encoder_decoder":
        if not (isinstance(layers, tuple) and len(layers) == 2):
            _fail(model, "the encoder's and the decoder's layers", "layers=(encoder layers, decoder layers)")
        spec["encoder_layers"], spec["decoder_layers"] = int(layers[0]), int(layers[1])
    else:
        if layers is None:
            if stack is None:
                _fail(model, "the transformer layers", "layers=", " (no nn.ModuleList or nn.Sequential of layers)")
            layers = len(stack)
        spec["num_layers"] = int(layers)
    token = _token_embedding(model)
    if hidden is None:
        hidden = token.embedding_dim if token is not None else _find_int([config] if config is not None else [],
                                                                          ("hidden_size", "n_embd", "d_model"))
        if hidden is None:
            _fail(model, "the hidden size", "hidden=", " (no nn.Embedding, no config.hidden_size)")
    if vocab is None:
        vocab = token.num_embeddings if token is not None else _find_int([config] if config is not None else [],
                                                                          ("vocab_size",))
        if vocab is None:
            _fail(model, "the vocabulary", "vocab=", " (no nn.Embedding, no config.vocab_size)")
    inside = list(block.modules()) if block is not None else []
    sources = inside + ([config] if config is not None else [])
    if heads is None:
        heads = _find_int(sources, _HEAD_NAMES)
        if heads is None:
            _fail(model, "the number of attention heads", "heads=",
                  f" (no attribute {', '.join(_HEAD_NAMES)} in its layer {type(block).__name__ if block else ''} or "
                  "config)")
    if kv_heads is None:
        kv_heads = _find_int(sources, _KV_NAMES) or heads
    if head_dim is None:
        head_dim = _find_int(sources, _HEAD_DIM_NAMES) or hidden // heads
    linears = [m for m in inside if isinstance(m, nn.Linear)]
    if ffn is None or gated_mlp is None:
        downs = sorted({m.in_features for m in linears
                        if m.out_features == hidden and m.in_features not in (hidden, heads * head_dim)})
        if ffn is None:
            if len(downs) != 1:
                _fail(model, "the FFN width", "ffn=",
                      f" (its layer {type(block).__name__ if block else '(none found)'} has "
                      f"{'no' if not downs else 'several'} nn.Linear mapping another width back to hidden {hidden}"
                      f"{': ' + ', '.join(map(str, downs)) if downs else ''})")
            ffn = downs[0]
        if gated_mlp is None:
            ups = [m for m in linears if m.in_features == hidden and m.out_features in (ffn, 2 * ffn)]
            gated_mlp = len(ups) >= 2 or any(m.out_features == 2 * ffn for m in ups)
    if dtype is None:
        dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
        if len(dtypes) != 1:
            _fail(model, "the parameters' dtype", "dtype=",
                  f" ({'no floating-point parameter' if not dtypes else 'several: ' + ', '.join(map(str, dtypes))})")
        dtype = dtypes.pop()
    spec.update(hidden=int(hidden), heads=int(heads), kv_heads=int(kv_heads), head_dim=int(head_dim),
                ffn_hidden=int(ffn), gated_mlp=bool(gated_mlp), vocab=int(vocab),
                bytes_per_param=torch.empty((), dtype=dtype).element_size())
    from packpipe.torch.data import _TORCH_DTYPE_NAMES
    if dtype in _TORCH_DTYPE_NAMES:  # the activations between stages: planning's default dtype
        spec["dtype"] = _TORCH_DTYPE_NAMES[dtype]
    return spec


def cost_model_files(spec: Union[Dict[str, Any], str], device: Union[str, Dict[str, Any]], directory: str,
                     inputs: Sequence[str] = ()) -> Tuple[str, str]:
    """Writes the model file (and, for a dict device, the device file) into `directory` (atomically;
    none may be one of `inputs`); returns (model file, device preset or file)."""
    model_file = os.path.join(directory, "model.json")
    outputs = {"model file": model_file}
    device_file = device
    if isinstance(device, dict):
        device_file = os.path.join(directory, "device.json")
        outputs["device file"] = device_file
    elif not isinstance(device, (str, os.PathLike)):
        raise TypeError(f"cost_model: device must be a preset name, a device .json file or a dict of its fields, "
                        f"found {type(device).__name__}")
    packpipe.check_outputs(outputs, inputs)
    packpipe.write_file_atomic(model_file, spec if isinstance(spec, str) else json.dumps(spec), inputs=inputs,
                               what="model file")
    if isinstance(device, dict):
        packpipe.write_file_atomic(device_file, json.dumps(device), inputs=inputs, what="device file")
    return model_file, str(device_file)


class ModuleCostModel(packpipe.CostModel):
    """A packpipe.CostModel made from a torch module (:func:`cost_model`): also knows the module's
    parameter dtype (PlanLoader's default activation dtype), its position limit (PlanLoader's default
    and largest max_seq_len), its parameter count and the model file."""
    torch_dtype: torch.dtype
    max_positions: Optional[int]  # the module's position limit (PlanLoader's default max_seq_len), if it says
    max_positions_from: str
    params: int
    spec: Dict[str, Any]


def cost_model(model: nn.Module, device: Union[str, Dict[str, Any]], *, profiles: Sequence[str] = (),
               calibration: str = "", directory: Optional[str] = None, attention: Optional[str] = None,
               **fields) -> ModuleCostModel:
    """packpipe's cost model of `model` on `device` (a preset name such as "H100-80GB", a device
    .json file, or a dict of the device file's fields such as packpipe.torch.models.CPU_DEVICE):
    the model file from :func:`describe_model` (``fields`` are its keyword arguments: layers=,
    heads=, ...), with `profiles` (packpipe profile's files: measured times) and `calibration` as
    CostModel takes them. The files are written into `directory` when given (kept there), else
    into a temporary folder removed once read. Warns when the parameters of the module's layers and
    token embedding are far from what the model file implies (the memory estimate's basis: a
    wrong layer count or width shows there). `attention` is the kernel the trainer runs ('eager' or
    'flash'); None: what packpipe.torch.attention runs for the module's parameters (their device and
    dtype: flash on a GPU with flash-attn or a fused SDPA, eager on CPU), written into the model file.
    With `profiles` it must be the kernel they were measured with."""
    spec = describe_model(model, **fields)
    module = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    dtype = fields.get("dtype") or {p.dtype for p in module.parameters() if p.is_floating_point()}.pop()
    if attention is None:
        if not profiles:
            from packpipe.torch.attention import kernel
            params = [p for p in module.parameters() if p.is_floating_point()]
            spec["attention"] = kernel(params[0].device if params else "cpu", dtype)
    else:
        spec["attention"] = _check.one_of("cost_model", "attention", attention, ("eager", "flash"))

    def build(d):
        model_file, device_file = cost_model_files(spec, device, d)
        return ModuleCostModel(model_file, device_file, list(profiles), calibration)

    if directory is not None:
        cm = build(directory)
    else:
        with tempfile.TemporaryDirectory(prefix="packpipe-model-") as d:
            cm = build(d)
    cm.torch_dtype = dtype
    cm.max_positions, cm.max_positions_from = max_positions(module)
    cm.params = _params(module)
    cm.spec = spec
    # What the model file describes: the layers and the token embedding (not, e.g., learned positions).
    _, stack = _layer_stack(module, spec.get("num_layers"))
    token = _token_embedding(module)
    counted = (_params(stack) if stack is not None else 0) + (token.weight.numel() if token is not None else 0)
    implied = int(cm.model["total_params"]) - 2 * spec["hidden"]
    if counted and not 0.5 <= counted / max(implied, 1) <= 2:
        warnings.warn(f"packpipe.torch.cost_model: the layers and token embedding of {type(module).__name__} have "
                      f"{counted:,} parameters, the model file {spec} implies {implied:,}: the cost model's memory "
                      "estimate assumes the latter (check layers=, hidden=, ffn=, vocab=)", stacklevel=2)
    return cm
