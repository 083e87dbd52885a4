"""Build an ``nn.Module`` from SequentialModel's ``layers`` param.

Two spellings are accepted, both CodefyUI's:

- **v2 (current)**: a JSON object (usually stored as a string) describing a
  small DAG::

      {"version": 2,
       "nodes": [{"id": "in", "type": "Input", "ports": [{"id": "p_x", "name": "x"}]},
                 {"id": "l1", "type": "Linear", "params": {"in_features": 4, "out_features": 16}},
                 {"id": "r1", "type": "ReLU"},
                 {"id": "out", "type": "Output", "ports": [{"id": "p_y", "name": "y"}]}],
       "edges": [{"id": "e1", "source": "in", "sourceHandle": "p_x", "target": "l1"},
                 {"id": "e2", "source": "l1", "target": "r1"},
                 {"id": "e3", "source": "r1", "target": "out", "targetHandle": "p_y"}]}

  Exactly one Input and one Output. A node with several incoming edges gets
  them as positional inputs in edge order (the merge layers Add, Concat,
  Multiply); Output returns its first input. Submodules are registered under
  their node id with ``-`` and ``.`` replaced by ``_``, so ``state_dict`` keys
  (``l1.weight``) match weights CodefyUI saved for the same spec.
- **v1 (legacy)**: a JSON list of layers, ``[{"type": "Linear",
  "in_features": 4, "out_features": 16}, {"type": "ReLU"}, ...]`` (or with the
  arguments under ``"params"``), built as an ``nn.Sequential``.
"""
from __future__ import annotations

import json
from collections import deque
from typing import Any

import torch
import torch.nn as nn


class AddMerge(nn.Module):
    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        out = tensors[0]
        for t in tensors[1:]:
            out = out + t
        return out


class ConcatMerge(nn.Module):
    def __init__(self, dim: int = 1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return torch.cat(tensors, dim=self.dim)


class MultiplyMerge(nn.Module):
    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        out = tensors[0]
        for t in tensors[1:]:
            out = out * t
        return out


class Reshape(nn.Module):
    """Reshape everything but the batch dimension; ``shape`` is ``"64,7,7"``."""

    def __init__(self, shape: str) -> None:
        super().__init__()
        self.shape = [int(d) for d in str(shape).split(",")]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.size(0), *self.shape)


class SelectIndex(nn.Module):
    def __init__(self, dim: int = 1, index: int = 0) -> None:
        super().__init__()
        self.dim, self.index = int(dim), int(index)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.select(self.dim, self.index)


# Attribute names below are state_dict prefixes (lstm., gru., encoder., ...):
# they match CodefyUI's so its saved weights load.
class LSTMBlock(nn.Module):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.lstm = nn.LSTM(**kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


class GRUBlock(nn.Module):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.gru = nn.GRU(**kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(x)[0]


class TransformerEncoderBlock(nn.Module):
    def __init__(self, d_model: int, nhead: int, num_layers: int = 1, dim_feedforward: int = 2048) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=d_model, nhead=nhead,
                                           dim_feedforward=dim_feedforward, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=num_layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


class TransformerDecoderBlock(nn.Module):
    def __init__(self, d_model: int, nhead: int, num_layers: int = 1, dim_feedforward: int = 2048) -> None:
        super().__init__()
        layer = nn.TransformerDecoderLayer(d_model=d_model, nhead=nhead,
                                           dim_feedforward=dim_feedforward, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, num_layers=num_layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(x, x)


class MultiHeadAttentionBlock(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim=embed_dim, num_heads=num_heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x)[0]


STANDARD: dict[str, type] = {
    "Conv2d": nn.Conv2d, "Conv1d": nn.Conv1d, "ConvTranspose2d": nn.ConvTranspose2d,
    "BatchNorm2d": nn.BatchNorm2d, "BatchNorm1d": nn.BatchNorm1d, "LayerNorm": nn.LayerNorm,
    "GroupNorm": nn.GroupNorm, "InstanceNorm2d": nn.InstanceNorm2d, "MaxPool2d": nn.MaxPool2d,
    "AvgPool2d": nn.AvgPool2d, "AdaptiveAvgPool2d": nn.AdaptiveAvgPool2d, "Dropout": nn.Dropout,
    "Linear": nn.Linear, "Flatten": nn.Flatten, "Embedding": nn.Embedding, "Identity": nn.Identity,
}
WRAPPERS: dict[str, type] = {
    "Reshape": Reshape, "SelectIndex": SelectIndex, "LSTM": LSTMBlock, "GRU": GRUBlock,
    "TransformerEncoder": TransformerEncoderBlock, "TransformerDecoder": TransformerDecoderBlock,
    "MultiHeadAttention": MultiHeadAttentionBlock,
}
MERGES: dict[str, type] = {"Add": AddMerge, "Concat": ConcatMerge, "Multiply": MultiplyMerge}
# Fresh instances, never in-place: a branched DAG reads a tensor twice.
ACTIVATIONS: dict[str, Any] = {
    "ReLU": nn.ReLU, "GELU": nn.GELU, "Sigmoid": nn.Sigmoid, "Tanh": nn.Tanh,
    "LeakyReLU": nn.LeakyReLU, "ELU": nn.ELU, "SiLU": nn.SiLU, "Mish": nn.Mish, "SELU": nn.SELU,
    "PReLU": nn.PReLU, "Hardswish": nn.Hardswish, "Softmax": lambda: nn.Softmax(dim=-1),
}
LAYER_TYPES = sorted([*STANDARD, *WRAPPERS, *MERGES, *ACTIVATIONS])


def build_layer(layer_type: str, params: dict[str, Any], where: str) -> nn.Module:
    if layer_type in ACTIVATIONS:
        return ACTIVATIONS[layer_type]()
    cls = MERGES.get(layer_type) or WRAPPERS.get(layer_type) or STANDARD.get(layer_type)
    if cls is None:
        raise ValueError(f"SequentialModel: unknown layer type {layer_type!r} at {where}; "
                         f"known types: {', '.join(LAYER_TYPES)}")
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"SequentialModel: bad parameters for {layer_type} at {where}: {exc}") from None


class GraphModel(nn.Module):
    """A layer DAG run in topological order; drop-in for ``nn.Sequential``."""

    def __init__(self, order: list[str], in_edges: dict[str, list[str]], input_id: str,
                 output_id: str, modules: dict[str, nn.Module]) -> None:
        super().__init__()
        self.order = list(order)
        self.in_edges = {k: list(v) for k, v in in_edges.items()}
        self.input_id, self.output_id = input_id, output_id
        self.attr_of = {nid: nid.replace(".", "_") for nid in modules}
        self.layers = nn.ModuleDict({self.attr_of[nid]: mod for nid, mod in modules.items()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values: dict[str, torch.Tensor] = {self.input_id: x}
        for nid in self.order:
            if nid == self.input_id:
                continue
            preds = self.in_edges.get(nid, [])
            if not preds:
                raise RuntimeError(f"layer {nid!r} has no input edge")
            if nid == self.output_id:
                return values[preds[0]]
            mod = self.layers[self.attr_of[nid]]
            values[nid] = mod(*[values[p] for p in preds])
        raise RuntimeError("the Output layer was never reached")


LEGACY_PREFIX = "layers."


def adapt_state_dict(model: nn.Module, state: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``state`` with keys renamed to ``model``'s layout when it is a layer graph
    saved by cdui 0.1 (top-level ``l1.weight`` instead of ``layers.l1.weight``).

    Returns ``(state, renamed)``; any other state is returned unchanged, so the
    caller's ``load_state_dict`` reports a real mismatch as it is."""
    if not isinstance(model, GraphModel) or not state:
        return state, False
    keys = set(model.state_dict())
    if any(str(k).startswith(LEGACY_PREFIX) for k in state):
        return state, False
    renamed = {LEGACY_PREFIX + str(k): v for k, v in state.items()}
    if set(renamed) <= keys:
        return renamed, True
    return state, False


def describe_mismatch(model: nn.Module, state: dict[str, Any]) -> str | None:
    """One readable sentence when ``state`` does not fit ``model`` (missing and
    unexpected keys, first few of each), or None when the keys match."""
    want, have = set(model.state_dict()), {str(k) for k in state}
    missing, unexpected = sorted(want - have), sorted(have - want)
    if not missing and not unexpected:
        return None
    parts = []
    if missing:
        parts.append(f"the model has {len(missing)} weight(s) the file lacks ({', '.join(missing[:4])}"
                     f"{', ...' if len(missing) > 4 else ''})")
    if unexpected:
        parts.append(f"the file has {len(unexpected)} weight(s) the model lacks ({', '.join(unexpected[:4])}"
                     f"{', ...' if len(unexpected) > 4 else ''})")
    return "; ".join(parts)


def _topo_order(node_ids: list[str], in_edges: dict[str, list[str]]) -> list[str]:
    succ: dict[str, list[str]] = {n: [] for n in node_ids}
    indeg = {n: 0 for n in node_ids}
    for n in node_ids:
        for p in in_edges[n]:
            succ[p].append(n)
            indeg[n] += 1
    queue = deque(n for n in node_ids if indeg[n] == 0)
    order: list[str] = []
    while queue:
        n = queue.popleft()
        order.append(n)
        for s in succ[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                queue.append(s)
    if len(order) != len(node_ids):
        raise ValueError("SequentialModel: the layer graph contains a cycle")
    return order


def build_graph_model(spec: dict[str, Any]) -> GraphModel:
    nodes = spec.get("nodes") or []
    edges = spec.get("edges") or []
    if not nodes:
        raise ValueError("SequentialModel: the layer graph has no nodes")
    ids = [str(n.get("id")) for n in nodes]
    if len(set(ids)) != len(ids):
        raise ValueError("SequentialModel: layer ids must be unique")
    inputs = [str(n["id"]) for n in nodes if n.get("type") == "Input"]
    outputs = [str(n["id"]) for n in nodes if n.get("type") == "Output"]
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(f"SequentialModel: the layer graph needs exactly 1 Input and 1 Output "
                         f"node, found {len(inputs)} and {len(outputs)}")
    in_edges: dict[str, list[str]] = {n: [] for n in ids}
    for e in edges:
        src, tgt = str(e.get("source")), str(e.get("target"))
        if src not in in_edges or tgt not in in_edges:
            raise ValueError(f"SequentialModel: edge {e.get('id')!r} references an unknown layer "
                             f"({src!r} -> {tgt!r})")
        in_edges[tgt].append(src)
    order = _topo_order(ids, in_edges)
    modules = {}
    for n in nodes:
        if n.get("type") in ("Input", "Output"):
            continue
        modules[str(n["id"])] = build_layer(str(n.get("type", "")), dict(n.get("params") or {}),
                                            f"layer {n['id']!r}")
    return GraphModel(order, in_edges, inputs[0], outputs[0], modules)


def build_sequential(layers: list[Any]) -> nn.Sequential:
    mods = []
    for i, cfg in enumerate(layers):
        if not isinstance(cfg, dict) or "type" not in cfg:
            raise ValueError(f"SequentialModel: layer {i} must be an object with a 'type', got {cfg!r}")
        params = dict(cfg.get("params") or {k: v for k, v in cfg.items() if k != "type"})
        mods.append(build_layer(str(cfg["type"]), params, f"layer {i}"))
    return nn.Sequential(*mods)


def build_model(layers: Any) -> nn.Module:
    """The module a ``layers`` param value (string or parsed JSON) describes."""
    spec = layers
    if isinstance(layers, str):
        try:
            spec = json.loads(layers) if layers.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"SequentialModel: `layers` is not valid JSON ({exc})") from None
    if isinstance(spec, list):
        return build_sequential(spec)
    if isinstance(spec, dict):
        if spec.get("version") == 2:
            return build_graph_model(spec)
        if isinstance(spec.get("layers"), list):
            return build_sequential(spec["layers"])
    raise ValueError("SequentialModel: `layers` must be a v2 layer graph "
                     "({\"version\": 2, \"nodes\": [...], \"edges\": [...]}) or a list of layers")
