"""LMTokenizedDataset: a text corpus packed into next-token blocks, as CodefyUI's.

Each row of the corpus is encoded (with the tokenizer's EOS after it), the
rows are joined into one token stream, and the stream is cut into blocks of
``seq_len + 1`` tokens; item ``i`` of the dataset is ``(block[:-1],
block[1:])`` as int64, so a DataLoader gives ``(B, seq_len)`` inputs and
labels shifted by one. The tokenizer is any object with ``encode`` (and
optionally ``encode_batch``) and ``eos_id``, as CodefyUI's LMTokenizer hands
over; the corpus anything with ``len`` and indexing that gives text.

Packed blocks are cached in the data folder's ``lm_token_cache/`` (or
``cache_dir`` under the data folder), keyed by a fingerprint of the tokenizer,
the params, the row count and a few sampled rows, as CodefyUI keys them: a
rerun on the same corpus loads the blocks instead of encoding again. Like
CodefyUI's, a corpus edited only in rows the fingerprint does not sample can
reuse a stale cache; ``cache=false`` opts out. The cache is read with
``torch.load(weights_only=True)``, so a planted file cannot run code. Pure
torch: no extra.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdui.core.paths import safe_join
from cdui.nodes.base import ANY, DATASET, SCALAR, Param, Port
from cdui.nodes.builtin._declared import B, DeclaredNode
from cdui.nodes.builtin._util import as_bool

if TYPE_CHECKING:  # pragma: no cover
    from cdui.core.layout import Layout
    from cdui.graph.context import RunContext

CHUNK_ROWS = 512  # rows per encode call: small enough to notice a stop soon
CACHE_FOLDER = "lm_token_cache"


class PackedLMDataset:
    """Fixed-length blocks of one packed token stream (int32 ``(num_blocks, seq_len + 1)`` at rest, to halve
    the memory of a large corpus; each item widened to the int64 an embedding lookup wants)."""

    def __init__(self, blocks: Any) -> None:
        if blocks.dim() != 2:
            raise ValueError(f"PackedLMDataset expects (num_blocks, seq_len+1), got {tuple(blocks.shape)}")
        self.blocks = blocks

    @property
    def seq_len(self) -> int:
        return int(self.blocks.shape[1]) - 1

    def __len__(self) -> int:
        return int(self.blocks.shape[0])

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        block = self.blocks[index].long()
        return block[:-1].contiguous(), block[1:].contiguous()


def cache_folder(layout: Layout, value: Any) -> Path:
    """``cache_dir`` under the data folder, or its ``lm_token_cache/``."""

    v = str(value or "").strip().replace("\\", "/").removeprefix("./")
    rel = v[5:] if v.startswith("data/") else (v or CACHE_FOLDER)
    return layout.check_not_private(safe_join(layout.data_dir, rel), v or CACHE_FOLDER)


def fingerprint(corpus: Any, tokenizer: Any, seq_len: int, append_eos: bool, max_tokens: int) -> str:
    rows = len(corpus)
    sampled = list(range(min(3, rows))) + [i for i in (rows - 2, rows - 1) if i >= 3]
    samples = [hashlib.sha1(str(corpus[i]).encode("utf-8", "replace")).hexdigest()[:16] for i in sampled]
    key = {"v": 1, "encoding": str(getattr(tokenizer, "encoding_name", type(tokenizer).__name__)),
           "seq_len": seq_len, "append_eos": append_eos, "max_tokens": max_tokens, "num_rows": rows,
           "samples": samples}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:24]


class LMTokenizedDatasetNode(DeclaredNode):
    NODE_NAME, CATEGORY = "LMTokenizedDataset", "LLM"
    DESCRIPTION = ("Tokenize a text corpus and pack it into fixed-length next-token blocks (input_ids, labels "
                   "shifted by one) for DataLoader -> TrainingLoop; packed blocks are cached on disk")
    INPUTS = (Port("dataset", DATASET, "Rows of raw text"),
              Port("tokenizer", ANY, "Tokenizer handle (encode / encode_batch / eos_id)"))
    OUTPUTS = (Port("dataset", DATASET, "Packed blocks yielding (input_ids int64[seq_len], labels int64[seq_len])"),
               Port("total_tokens", SCALAR, "Tokens in the packed stream (after any max_tokens cap)"),
               Port("num_blocks", SCALAR, "Number of seq_len-sized training blocks"))
    PARAMS = (Param("seq_len", "int", 1024, "Block length in tokens (at most the model's max_seq_len)",
                    min_value=16, max_value=8192),
              B("append_eos", True, "Append the tokenizer's EOS after each row so the model learns document "
                "boundaries"),
              Param("max_tokens", "int", 0, "Cap the packed stream at N tokens (0 = all)", min_value=0),
              Param("cache", "bool", True, "Cache packed blocks on disk (lm_token_cache/ under the data folder)",
                    writes=True, advanced=True),
              Param("cache_dir", "string", "", "Another cache folder, under the data folder", advanced=True))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        corpus, tokenizer = inputs.get("dataset"), inputs.get("tokenizer")
        if corpus is None:
            raise ValueError("LMTokenizedDataset requires a `dataset` input (rows of raw text)")
        if tokenizer is None or not hasattr(tokenizer, "encode") or not hasattr(tokenizer, "eos_id"):
            raise ValueError("LMTokenizedDataset requires a `tokenizer` input: an object with encode (or "
                             "encode_batch) and eos_id, as CodefyUI's LMTokenizer gives")
        seq_len = max(16, min(8192, int(params.get("seq_len") or 1024)))
        append_eos = as_bool(params.get("append_eos"), True)
        max_tokens = max(0, int(params.get("max_tokens") or 0))
        rows = len(corpus)
        if rows == 0:
            raise ValueError("LMTokenizedDataset: the text corpus has no rows to tokenize")
        cache_path = None
        if as_bool(params.get("cache"), True):
            key = fingerprint(corpus, tokenizer, seq_len, append_eos, max_tokens)
            cache_path = cache_folder(ctx.layout, params.get("cache_dir")) / f"lmpack-{key}.pt"
            if cache_path.is_file():
                payload = torch.load(cache_path, map_location="cpu", weights_only=True)
                dataset = PackedLMDataset(payload["blocks"])
                ctx.log(f"LMTokenizedDataset: {len(dataset)} blocks loaded from the cache {cache_path.name}")
                return {"dataset": dataset, "total_tokens": int(payload["total_tokens"]), "num_blocks": len(dataset)}
        eos = [int(tokenizer.eos_id)] if append_eos else []
        pieces, total = [], 0
        for start in range(0, rows, CHUNK_ROWS):
            ctx.check_stop()
            texts = [str(corpus[i]) for i in range(start, min(start + CHUNK_ROWS, rows))]
            encoded = (tokenizer.encode_batch(texts) if hasattr(tokenizer, "encode_batch")
                       else [tokenizer.encode(t) for t in texts])
            flat: list[int] = []
            for ids in encoded:
                flat.extend(int(i) for i in ids)
                flat.extend(eos)
            if flat:
                pieces.append(torch.tensor(flat, dtype=torch.int32))
                total += len(flat)
            ctx.progress(rows=min(start + CHUNK_ROWS, rows), total_rows=rows, tokens=total)
            if max_tokens and total >= max_tokens:
                break
        stream = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int32)
        if max_tokens:
            stream = stream[:max_tokens]
        total = int(stream.numel())
        block = seq_len + 1
        usable = total // block * block
        if usable == 0:
            raise ValueError(f"LMTokenizedDataset: the corpus is too small: {total} tokens cannot fill one block "
                             f"of seq_len+1 = {block}; lower seq_len or give more text")
        blocks = stream[:usable].view(-1, block).clone()
        if cache_path is not None:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            temp = cache_path.with_suffix(".tmp")
            torch.save({"blocks": blocks, "total_tokens": total}, temp)
            temp.replace(cache_path)
        dataset = PackedLMDataset(blocks)
        return {"dataset": dataset, "total_tokens": total, "num_blocks": len(dataset)}
