"""Sequence nodes: recurrent layers (CodefyUI's "RNN" family), attention and
transformer stacks ("Transformer"), and Embedding.

As in CodefyUI: the transformer and attention modules are sequence-first
(``batch_first=False``: inputs are (L, N, E)) and stay in training mode, so
their dropout makes outputs differ run to run; ``LSTM``'s ``hidden`` output is
h_n only; ``RNNCell`` and ``MoELayer`` take their weights from a seed, drawn
from a private generator so they never disturb the run's global random state.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cdui.nodes.base import Param
from cdui.nodes.builtin._declared import B, DeclaredNode, I, T, int_param
from cdui.nodes.builtin._util import as_bool

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

_RNN_PARAMS = (I("input_size", 128, "Features per step"), I("hidden_size", 256, "Hidden features"),
               I("num_layers", 1, "Stacked layers"), B("batch_first", True, "Input is (N, L, F) rather than (L, N, F)"),
               B("bidirectional", False, "Run both directions"))
_RNN_OUT = (T("output", "Output at every step"), T("hidden", "Final hidden state h_n"))


def _rnn(node: DeclaredNode, cls: Any, inputs: dict[str, Any], params: dict[str, Any]) -> tuple[Any, Any]:
    x = node.float_tensor(inputs)
    layer = cls(int_param(params, "input_size", 128), int_param(params, "hidden_size", 256),
                num_layers=int_param(params, "num_layers", 1),
                batch_first=as_bool(params.get("batch_first"), True),
                bidirectional=as_bool(params.get("bidirectional"), False)).to(x.device)
    if x.dim() not in (2, 3) or x.shape[-1] != layer.input_size:
        raise ValueError(f"{node.NODE_NAME}: input of shape {tuple(x.shape)} does not fit; it expects "
                         f"(N, L, {layer.input_size}) with batch_first, else (L, N, {layer.input_size})")
    return layer(x)


class LSTMNode(DeclaredNode):
    NODE_NAME, CATEGORY = "LSTM", "RNN"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Long short-term memory layer"
    INPUTS, OUTPUTS, PARAMS = (T("tensor", "Sequence"),), _RNN_OUT, _RNN_PARAMS

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        out, (h_n, _c_n) = _rnn(self, nn.LSTM, inputs, params)
        return {"output": out, "hidden": h_n}


class GRUNode(DeclaredNode):
    NODE_NAME, CATEGORY = "GRU", "RNN"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Gated recurrent unit layer"
    INPUTS, OUTPUTS, PARAMS = (T("tensor", "Sequence"),), _RNN_OUT, _RNN_PARAMS

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        out, h_n = _rnn(self, nn.GRU, inputs, params)
        return {"output": out, "hidden": h_n}


def seeded_rnn_cell(input_size: int, hidden_size: int, nonlinearity: str, seed: int) -> Any:
    """An ``nn.RNNCell`` whose matrices are randn(seed) / sqrt(hidden) and whose biases are zero."""
    import torch
    import torch.nn as nn

    cell = nn.RNNCell(input_size, hidden_size, nonlinearity=nonlinearity)
    gen = torch.Generator().manual_seed(int(seed))
    scale = 1.0 / math.sqrt(max(1, hidden_size))
    with torch.no_grad():
        for p in cell.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
            else:
                p.zero_()
    return cell


class RNNCellNode(DeclaredNode):
    NODE_NAME, CATEGORY = "RNNCell", "RNN"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "One step of a plain recurrent cell: h' = f(W_ih x + W_hh h + b)"
    INPUTS = (T("tensor", "Input at this step (N, input_size)"),
              T("hidden", "Previous hidden state (N, hidden_size); zeros when absent", optional=True))
    OUTPUTS = (T("hidden", "New hidden state"),)
    PARAMS = (I("input_size", 8, "Input features", lo=1), I("hidden_size", 16, "Hidden features", lo=1),
              Param("nonlinearity", "select", "tanh", "Activation of the recurrence", options=["tanh", "relu"]),
              I("seed", 42, "Seed of the weights"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        x = self.float_tensor(inputs)
        n_in, n_h = int_param(params, "input_size", 8), int_param(params, "hidden_size", 16)
        if x.dim() != 2 or x.shape[-1] != n_in:
            raise ValueError(f"RNNCell: input of shape {tuple(x.shape)} does not fit (N, input_size={n_in})")
        h = inputs.get("hidden")
        if h is not None:
            h = self.float_tensor(inputs, "hidden")
            if tuple(h.shape) != (x.shape[0], n_h):
                raise ValueError(f"RNNCell: hidden of shape {tuple(h.shape)} does not fit "
                                 f"(N={x.shape[0]}, hidden_size={n_h})")
        cell = seeded_rnn_cell(n_in, n_h, str(params.get("nonlinearity") or "tanh"),
                               int_param(params, "seed", 42)).to(x.device)
        return {"hidden": cell(x, h)}


class MultiHeadAttentionNode(DeclaredNode):
    NODE_NAME, CATEGORY = "MultiHeadAttention", "Transformer"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Multi-head attention over sequence-first (L, N, E) query, key and value"
    INPUTS = (T("query", "Query (L, N, E)"), T("key", "Key (S, N, E)"), T("value", "Value (S, N, E)"))
    OUTPUTS = (T("output", "Attended output (L, N, E)"), T("weights", "Weights averaged over heads (N, L, S)"))
    PARAMS = (I("embed_dim", 512, "Embedding size E"), I("num_heads", 8, "Heads (must divide embed_dim)"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        e, heads = int_param(params, "embed_dim", 512), int_param(params, "num_heads", 8)
        if heads < 1 or e % heads:
            raise ValueError(f"MultiHeadAttention: embed_dim={e} must be divisible by num_heads={heads}")
        q, k, v = (self.float_tensor(inputs, n) for n in ("query", "key", "value"))
        for name, t in (("query", q), ("key", k), ("value", v)):
            if t.shape[-1] != e:
                raise ValueError(f"MultiHeadAttention: {name} of shape {tuple(t.shape)} does not end in "
                                 f"embed_dim={e}")
        attn = nn.MultiheadAttention(e, heads).to(q.device)
        out, weights = attn(q, k, v)
        return {"output": out, "weights": weights}


_STACK_PARAMS = (I("d_model", 512, "Model width"), I("nhead", 8, "Attention heads"),
                 I("num_layers", 6, "Stacked layers"), I("dim_feedforward", 2048, "Feed-forward width"))


def _stack_sizes(node: DeclaredNode, params: dict[str, Any]) -> tuple[int, int, int, int]:
    d, h = int_param(params, "d_model", 512), int_param(params, "nhead", 8)
    if h < 1 or d % h:
        raise ValueError(f"{node.NODE_NAME}: d_model={d} must be divisible by nhead={h}")
    return d, h, int_param(params, "num_layers", 6), int_param(params, "dim_feedforward", 2048)


class TransformerEncoderNode(DeclaredNode):
    NODE_NAME, CATEGORY = "TransformerEncoder", "Transformer"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "A stack of transformer encoder layers over sequence-first (L, N, d_model)"
    INPUTS, OUTPUTS = (T("tensor", "Sequence (L, N, d_model)"),), (T("tensor", "Encoded sequence"),)
    PARAMS = _STACK_PARAMS

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        d, h, n, ff = _stack_sizes(self, params)
        x = self.float_tensor(inputs)
        if x.shape[-1] != d:
            raise ValueError(f"TransformerEncoder: input of shape {tuple(x.shape)} does not end in d_model={d}")
        stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, h, dim_feedforward=ff), num_layers=n,
                                      enable_nested_tensor=False).to(x.device)
        return {"tensor": stack(x)}


class TransformerDecoderNode(DeclaredNode):
    NODE_NAME, CATEGORY = "TransformerDecoder", "Transformer"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "A stack of transformer decoder layers: decode tensor against memory (sequence-first)"
    INPUTS = (T("tensor", "Target sequence (T, N, d_model)"), T("memory", "Encoder output (S, N, d_model)"))
    OUTPUTS, PARAMS = (T("tensor", "Decoded sequence"),), _STACK_PARAMS

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        d, h, n, ff = _stack_sizes(self, params)
        x, memory = self.float_tensor(inputs), self.float_tensor(inputs, "memory")
        for name, t in (("tensor", x), ("memory", memory)):
            if t.shape[-1] != d:
                raise ValueError(f"TransformerDecoder: {name} of shape {tuple(t.shape)} does not end in d_model={d}")
        stack = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, h, dim_feedforward=ff), num_layers=n).to(x.device)
        return {"tensor": stack(x, memory.to(x.device))}


class EmbeddingNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Embedding", "Utility"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Look up a learned vector per integer index"
    INPUTS, OUTPUTS = (T("tensor", "Indices (any shape, integers)"),), (T("tensor", "Vectors (..., embedding_dim)"),)
    PARAMS = (I("num_embeddings", 10000, "Vocabulary size"), I("embedding_dim", 256, "Vector size"),
              I("padding_idx", -1, "Index whose vector stays zero; below 0 for none"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        x = self.tensor(inputs)
        n, dim, pad = (int_param(params, "num_embeddings", 10000), int_param(params, "embedding_dim", 256),
                       int_param(params, "padding_idx", -1))
        if x.is_floating_point():
            if not bool((x == x.round()).all()):
                raise ValueError("Embedding: the input holds fractions; it needs integer indices")
            x = x.long()
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= n):
            raise ValueError(f"Embedding: indices run from {int(x.min())} to {int(x.max())} but "
                             f"num_embeddings={n} allows 0..{n - 1}")
        layer = nn.Embedding(n, dim, padding_idx=pad if pad >= 0 else None).to(x.device)
        return {"tensor": layer(x)}


def build_moe(num_experts: int, top_k: int, hidden: int, inner: int, seed: int) -> Any:
    """A top-k gated mixture of SiLU two-layer experts, weights drawn from ``seed``."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as functional

    class Expert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(functional.silu(self.fc1(x)))

    class MoE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.top_k = max(1, min(top_k, num_experts))
            self.gate = nn.Linear(hidden, num_experts, bias=False)
            self.experts = nn.ModuleList(Expert() for _ in range(num_experts))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            b, t, h = x.shape
            values, idx = torch.topk(self.gate(x), k=self.top_k, dim=-1)
            weights = functional.softmax(values, dim=-1)
            flat, flat_idx, flat_w = x.reshape(b * t, h), idx.reshape(b * t, -1), weights.reshape(b * t, -1)
            out = torch.zeros_like(flat)
            for slot in range(self.top_k):
                for e, expert in enumerate(self.experts):
                    mask = flat_idx[:, slot] == e
                    if bool(mask.any()):
                        out[mask] = out[mask] + flat_w[mask, slot].unsqueeze(-1) * expert(flat[mask])
            return out.reshape(b, t, h), weights, idx

    moe = MoE()
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for module in moe.modules():
            if isinstance(module, nn.Linear):
                bound = 1.0 / math.sqrt(module.in_features)
                module.weight.copy_((torch.rand(module.weight.shape, generator=gen) * 2 - 1) * bound)
                if module.bias is not None:
                    module.bias.copy_((torch.rand(module.bias.shape, generator=gen) * 2 - 1) * bound)
    return moe


class MoELayerNode(DeclaredNode):
    NODE_NAME, CATEGORY = "MoELayer", "Transformer"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Mixture of experts: each token goes to its top-k experts, outputs weighted and summed"
    INPUTS = (T("x", "Hidden states (B, T, H) or (T, H)"),)
    OUTPUTS = (T("output", "Same shape as the input"), T("routing_weights", "Weights of the chosen experts (B, T, k)"),
               T("expert_indices", "Chosen experts (B, T, k)"))
    PARAMS = (I("num_experts", 4, "Experts", lo=1), I("top_k", 2, "Experts per token (at most num_experts)", lo=1),
              I("hidden_dim", 128, "Token width H", lo=1),
              I("expert_hidden_dim", 256, "Inner width of each expert", lo=1), I("seed", 42, "Seed of the weights"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        x = self.float_tensor(inputs, "x")
        if x.dim() == 2:
            x = x.unsqueeze(0)
        hidden = int_param(params, "hidden_dim", 128)
        if x.dim() != 3:
            raise ValueError(f"MoELayer: x of shape {tuple(x.shape)} is not (B, T, H) or (T, H)")
        if x.shape[-1] != hidden:
            # A width the layer's weights do not take is torch's RuntimeError in CodefyUI too.
            raise RuntimeError(f"MoELayer: x of shape {tuple(x.shape)} does not fit hidden_dim={hidden}; "
                               f"set hidden_dim to {x.shape[-1]}")
        moe = build_moe(max(1, int_param(params, "num_experts", 4)), max(1, int_param(params, "top_k", 2)),
                        hidden, int_param(params, "expert_hidden_dim", 256), int_param(params, "seed", 42))
        with torch.no_grad():
            out, weights, idx = moe.to(x.device)(x)
        return {"output": out, "routing_weights": weights, "expert_indices": idx}
