"""CodefyUI's LLM teaching blocks that need nothing beyond torch: cosine
similarity with top-k retrieval, attention masks and positional encodings."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cdui.nodes.base import LIST, Param, Port
from cdui.nodes.builtin._declared import DeclaredNode, I, T, int_param

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

LLM = "LLM"
# Longest sequence a mask or position table is built for: a [seq, seq] mask
# of 16384 is already 256 MiB of booleans.
MAX_SEQ = 16384


def _rows(node: DeclaredNode, inputs: dict[str, Any], name: str) -> Any:
    x = node.float_tensor(inputs, name)
    if x.dim() == 1:
        x = x.unsqueeze(0)
    if x.dim() != 2:
        raise ValueError(f"CosineSimilarity: {name} must be 1-D or 2-D, got shape {tuple(x.shape)}")
    return x


class CosineSimilarityNode(DeclaredNode):
    NODE_NAME, CATEGORY = "CosineSimilarity", LLM
    DESCRIPTION = "Cosine similarity of every query row with every key row, and each query's top-k keys"
    INPUTS = (T("queries", "[Q, D] (or [D] for one query)"), T("keys", "[K, D]"),
              Port("key_labels", LIST, "K labels, for top_k_labels", optional=True))
    OUTPUTS = (T("similarity", "[Q, K]"), Port("top_k_indices", LIST, "Per query, the best key indices first"),
               Port("top_k_labels", LIST, "Per query, their labels (empty lists without key_labels)"))
    PARAMS = (I("top_k", 5, "Keys per query", lo=1),
              Param("exclude_self_words", "string", "", "Comma-separated labels never returned in the top-k"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch
        import torch.nn.functional as functional

        q, k = _rows(self, inputs, "queries"), _rows(self, inputs, "keys")
        if q.shape[1] != k.shape[1]:
            raise ValueError(f"CosineSimilarity: queries have D={q.shape[1]} but keys D={k.shape[1]}")
        labels = [str(label) for label in (inputs.get("key_labels") or [])]
        if labels and len(labels) != k.shape[0]:
            raise ValueError(f"CosineSimilarity: {len(labels)} key_labels for {k.shape[0]} keys")
        sim = functional.normalize(q, dim=1, eps=1e-12) @ functional.normalize(k.to(q.device), dim=1, eps=1e-12).T
        excluded = {w.strip().lower() for w in str(params.get("exclude_self_words") or "").split(",") if w.strip()}
        ranked = sim.clone()
        for j, label in enumerate(labels):
            if label.lower() in excluded:
                ranked[:, j] = -math.inf
        top_k = min(max(1, int_param(params, "top_k", 5)), k.shape[0])
        indices: list[list[int]] = []
        if q.shape[0] and top_k:
            indices = torch.topk(ranked, k=top_k, dim=1).indices.tolist()
        return {"similarity": sim, "top_k_indices": indices,
                "top_k_labels": [[labels[j] for j in row] if labels else [] for row in indices]}


class AttentionMaskNode(DeclaredNode):
    NODE_NAME, CATEGORY = "AttentionMask", LLM
    DESCRIPTION = "A [seq, seq] boolean mask, True where attention is blocked (causal or padding)"
    INPUTS = (T("tensor", "Sequence-first tensor [seq, ...]: its length sets seq", optional=True),
              Port("tokens", LIST, "Tokens: their count sets seq; padding mode blocks the pad tokens",
                   optional=True))
    OUTPUTS = (T("mask", "[seq, seq] bool"),)
    PARAMS = (Param("mode", "select", "causal", "causal: block future positions; padding: block pad keys",
                    options=["causal", "padding"]),
              Param("pad_token", "string", "<pad>", "The padding token, for padding mode"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        tokens = inputs.get("tokens")
        mode = str(params.get("mode") or "causal")
        if mode not in ("causal", "padding"):
            raise ValueError(f"AttentionMask: unknown mode {mode!r}")
        if tokens is not None:
            tokens = [str(t) for t in tokens]
            seq = len(tokens)
        elif inputs.get("tensor") is not None:
            seq = int(self.tensor(inputs).shape[0])
        else:
            raise ValueError("AttentionMask: connect a tensor or a token list to set the sequence length")
        if seq > MAX_SEQ:
            raise ValueError(f"AttentionMask: sequence length {seq} is larger than {MAX_SEQ}")
        if mode == "causal":
            mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
        else:
            if tokens is None:
                raise ValueError("AttentionMask: padding mode needs the tokens input")
            pad = str(params.get("pad_token") or "<pad>")
            blocked = torch.tensor([t == pad for t in tokens], dtype=torch.bool)
            mask = blocked.unsqueeze(0).expand(seq, seq).clone()
        return {"mask": mask}


def sinusoidal_table(seq: int, d: int) -> Any:
    """Vaswani's table: even dims sin(pos / 10000^(2i/d)), odd dims the cos."""
    import torch

    pe = torch.zeros(seq, d, dtype=torch.float32)
    pos = torch.arange(seq, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * -(math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(pos * div[:pe[:, 0::2].shape[1]])
    pe[:, 1::2] = torch.cos(pos * div[:pe[:, 1::2].shape[1]])
    return pe


class PositionalEncodingNode(DeclaredNode):
    NODE_NAME, CATEGORY = "PositionalEncoding", LLM
    DESCRIPTION = "Adds a position table (sinusoidal, or seeded random) to [seq, D] or [seq, B, D]"
    INPUTS = (T("tensor", "Embeddings [seq, D] or [seq, batch, D]"),)
    OUTPUTS = (T("tensor", "Input plus the table"), T("pe", "The table alone, [seq, D]"))
    PARAMS = (Param("mode", "select", "sinusoidal", "sinusoidal (Vaswani) or learnable (seeded random)",
                    options=["sinusoidal", "learnable"]),
              I("max_len", 512, "Longest sequence accepted", lo=1), I("seed", 42, "Seed of the learnable table"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        x = self.tensor(inputs).float()
        if x.dim() not in (2, 3):
            raise ValueError(f"PositionalEncoding: expects [seq, D] or [seq, batch, D], got {tuple(x.shape)}")
        seq, d = int(x.shape[0]), int(x.shape[-1])
        max_len = int_param(params, "max_len", 512)
        if seq > max_len:
            raise ValueError(f"PositionalEncoding: sequence length {seq} exceeds max_len={max_len}")
        mode = str(params.get("mode") or "sinusoidal")
        if mode == "sinusoidal":
            pe = sinusoidal_table(seq, d)
        elif mode == "learnable":
            gen = torch.Generator().manual_seed(int_param(params, "seed", 42))
            pe = torch.randn(seq, d, generator=gen, dtype=torch.float32) / math.sqrt(d)
        else:
            raise ValueError(f"PositionalEncoding: unknown mode {mode!r}")
        pe = pe.to(x.device)
        return {"tensor": x + (pe if x.dim() == 2 else pe.unsqueeze(1)), "pe": pe}
