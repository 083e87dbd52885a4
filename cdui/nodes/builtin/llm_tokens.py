"""Tokenizer and AttentionHeatmap, the LLM teaching nodes that need no model.

**Tokenizer reads local files only** (labs are often offline; CodefyUI
downloads them on first use). Where each family is looked for, in order:

- tiktoken families (``cl100k_base``, ``o200k_base``, ``p50k_base``, ``gpt2``;
  the ``tokenizers`` extra installs tiktoken): ``data/tokenizers/<family>.tiktoken``
  (the file from ``https://openaipublic.blob.core.windows.net/encodings/``; gpt2
  is ``r50k_base.tiktoken``), then tiktoken's own cache (``TIKTOKEN_CACHE_DIR``,
  ``DATA_GYM_CACHE_DIR``, else ``<tmp>/data-gym-cache``). tiktoken itself loads
  it and checks its published SHA-256, so a wrong file is refused.
- Hugging Face families (``bert-base-uncased``, ``Llama-3``, ``T5``; the
  ``tokenizers`` library): ``data/tokenizers/<family>/tokenizer.json``, then the
  Hugging Face hub cache (``HF_HUB_CACHE``, ``HF_HOME/hub``, else
  ``~/.cache/huggingface/hub``) snapshot of CodefyUI's repo for the family.

A missing file fails the graph at validation, naming the files looked for and
where to get them.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cdui.nodes.base import LIST, STRING, Param, Port, package_available
from cdui.nodes.builtin._declared import B, DeclaredNode, T, int_param
from cdui.nodes.builtin._util import as_bool

if TYPE_CHECKING:  # pragma: no cover
    from cdui.core.layout import Layout
    from cdui.graph.context import RunContext

TIKTOKEN_FAMILIES = {"cl100k_base": "cl100k_base", "o200k_base": "o200k_base", "p50k_base": "p50k_base",
                     "gpt2": "r50k_base"}  # family -> the name of its BPE file
TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"
HF_FAMILIES = {"bert-base-uncased": "bert-base-uncased", "Llama-3": "Xenova/llama-3-tokenizer",
               "T5": "google/t5-v1_1-base"}  # family -> its Hugging Face repo (CodefyUI's choice)
FAMILIES = list(TIKTOKEN_FAMILIES) + list(HF_FAMILIES)
# Text is tokenized in the run's memory: bound it before the tokenizer sees it.
MAX_TEXT_CHARS = 4_000_000
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024


def _tiktoken_cache_dir() -> Path:
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def tokenizer_candidates(layout: Layout, family: str) -> list[Path]:
    """The files that hold ``family``, in the order they are looked for."""
    base = layout.data_dir / "tokenizers"
    if family in TIKTOKEN_FAMILIES:
        url = TIKTOKEN_URL.format(TIKTOKEN_FAMILIES[family])
        return [base / f"{TIKTOKEN_FAMILIES[family]}.tiktoken",
                _tiktoken_cache_dir() / hashlib.sha1(url.encode()).hexdigest()]
    repo = HF_FAMILIES[family]
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or Path.home() / ".cache" /
                                                        "huggingface") / "hub")
    snapshots = hub / f"models--{repo.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/tokenizer.json")) if snapshots.is_dir() else []
    ref = hub / f"models--{repo.replace('/', '--')}" / "refs" / "main"
    revision = ref.read_text(encoding="utf-8", errors="replace").strip()[:64] if ref.is_file() else ""
    if re.fullmatch(r"[0-9a-f]{7,64}", revision):  # the revision the hub cache calls current comes first
        main = snapshots / revision / "tokenizer.json"
        found = [main] + [p for p in found if p != main]
    return [base / family / "tokenizer.json", *found] if found else [base / family / "tokenizer.json",
                                                                     snapshots / "<revision>" / "tokenizer.json"]


def find_tokenizer(layout: Layout, family: str) -> Path | None:
    for path in tokenizer_candidates(layout, family):
        if path.is_file():
            return path
    return None


def missing_tokenizer_message(layout: Layout, family: str) -> str:
    looked = ", ".join(str(p) for p in tokenizer_candidates(layout, family))
    if family in TIKTOKEN_FAMILIES:
        name = TIKTOKEN_FAMILIES[family]
        get = (f"download {TIKTOKEN_URL.format(name)} on a connected machine and put it at "
               f"{layout.data_dir / 'tokenizers' / (name + '.tiktoken')}")
    else:
        get = (f"download tokenizer.json from https://huggingface.co/{HF_FAMILIES[family]} on a connected machine "
               f"and put it at {layout.data_dir / 'tokenizers' / family / 'tokenizer.json'}")
    return f"tokenizer {family} is not on this machine (looked for {looked}). cdui never downloads: {get}"


def _load_tiktoken(family: str, path: Path) -> Any:
    import tiktoken
    import tiktoken.load
    from tiktoken_ext import openai_public

    name = TIKTOKEN_FAMILIES[family]

    def local(_url: str, expected_hash: str | None = None) -> Any:
        # tiktoken's own reader on the local file instead of the URL; tiktoken checks the
        # published SHA-256 only of what it downloads, so it is checked here
        if expected_hash and hashlib.sha256(path.read_bytes()).hexdigest() != expected_hash:
            raise ValueError(f"{path}: its SHA-256 is not the published {expected_hash}")
        return tiktoken.load.load_tiktoken_bpe(str(path), expected_hash=expected_hash)

    with _TIKTOKEN_LOCK:  # the constructor's loader is swapped for the duration of the call
        return _construct_tiktoken(name, local, openai_public)


_TIKTOKEN_LOCK = threading.Lock()


def _construct_tiktoken(name: str, local: Any, openai_public: Any) -> Any:
    import tiktoken

    real_loader = openai_public.load_tiktoken_bpe
    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # tiktoken: an empty cache folder means read the file, copy nothing
    openai_public.load_tiktoken_bpe = local
    try:
        spec = openai_public.ENCODING_CONSTRUCTORS[name]()
    except ValueError as exc:
        raise ValueError(f"Tokenizer: the file is not the published {name}.tiktoken ({exc})") from None
    finally:
        openai_public.load_tiktoken_bpe = real_loader
        if previous is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous
    return tiktoken.Encoding(**spec)


class TokenizerNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Tokenizer", "LLM"
    DESCRIPTION = "Split text into the tokens an LLM sees (tiktoken BPE or a Hugging Face tokenizer.json)"
    NEEDS: ClassVar[tuple[str, ...]] = ("tiktoken", "tokenizers")
    EXTRA: ClassVar[str | None] = "tokenizers"
    INPUTS = (Port("text", STRING, "Text (falls back to the `text` param when not connected)", optional=True),)
    OUTPUTS = (Port("tokens", LIST, "Token strings"), Port("token_ids", LIST, "Token ids"),
               Port("offsets", LIST, "[start, end] character offsets of each token"))
    PARAMS = (Param("family", "select", "cl100k_base", "Tokenizer family (files read from the data folder)",
                    options=FAMILIES),
              Param("text", "string", "The quick brown fox jumps over the lazy dog.",
                    "Text to tokenize when no `text` input is connected"),
              B("show_special_tokens", False, "Add the tokenizer's special tokens (CLS/SEP/BOS/EOS)"))

    @classmethod
    def preflight(cls, params: dict[str, Any], layout: Layout) -> list[tuple[str, str]]:
        family = str(params.get("family") or "cl100k_base")
        if family not in FAMILIES:
            return []  # the param check reports it
        package = "tiktoken" if family in TIKTOKEN_FAMILIES else "tokenizers"
        if not package_available(package):
            return [("missing_extra", f"family {family} needs {package}, which is not installed on this machine: "
                     f"install the tokenizers extra with `bin/cdui start --extras tokenizers`")]
        if find_tokenizer(layout, family) is None:
            return [("missing_tokenizer", missing_tokenizer_message(layout, family))]
        return []

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        family = str(params.get("family") or "cl100k_base")
        if family not in FAMILIES:
            raise ValueError(f"Tokenizer: unknown family {family!r}; use one of {FAMILIES}")
        value = inputs.get("text")
        if isinstance(value, list):  # CodefyUI tokenizes the first item of a list
            value = value[0] if value else ""
        text = str(params.get("text", "") if value is None else value)
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"Tokenizer: the text has {len(text):,} characters, more than {MAX_TEXT_CHARS:,}")
        path = find_tokenizer(ctx.layout, family)
        if path is None:
            raise ValueError(missing_tokenizer_message(ctx.layout, family))
        if path.stat().st_size > MAX_TOKENIZER_BYTES:
            raise ValueError(f"Tokenizer: {path} is larger than {MAX_TOKENIZER_BYTES // (1024 * 1024)} MiB")
        if family in TIKTOKEN_FAMILIES:
            enc = _load_tiktoken(family, path)
            ids = [int(i) for i in enc.encode(text, disallowed_special=())]
            tokens = [enc.decode([i]) for i in ids]
            offsets, cursor = [], 0
            for tok in tokens:  # CodefyUI's offsets: running lengths of the decoded tokens
                offsets.append([cursor, cursor + len(tok)])
                cursor += len(tok)
        else:
            from tokenizers import Tokenizer

            enc = Tokenizer.from_file(str(path))
            encoding = enc.encode(text, add_special_tokens=as_bool(params.get("show_special_tokens")))
            tokens, ids = list(encoding.tokens), [int(i) for i in encoding.ids]
            offsets = [[int(s), int(e)] for s, e in encoding.offsets]
        return {"tokens": tokens, "token_ids": ids, "offsets": offsets}


class AttentionHeatmapNode(DeclaredNode):
    NODE_NAME, CATEGORY = "AttentionHeatmap", "LLM"
    DESCRIPTION = "Pass attention weights through (optionally one head) so they can be drawn as a heatmap"
    INPUTS = (T("weights", "Attention weights [seq, seq], [H, seq, seq] or [B, H, seq, seq]"),
              Port("labels", LIST, "Token labels for the axes", optional=True))
    OUTPUTS = (T("weights", "The weights, or the chosen head"), Port("labels", LIST, "The labels ([] when none)"))
    PARAMS = (Param("head_index", "int", -1, "Head to keep of 3-D/4-D weights (-1: all heads)"),
              Param("colormap", "select", "viridis", "Colour map of the heatmap (display only)",
                    options=["viridis", "blues", "RdBu"]))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        weights = self.float_tensor(inputs, "weights") if not _is_tensor(inputs.get("weights")) \
            else inputs["weights"]
        head = int_param(params, "head_index", -1)
        if head >= 0 and weights.dim() in (3, 4):
            axis = weights.dim() - 3  # heads: dim 0 of [H, s, s], dim 1 of [B, H, s, s]
            heads = int(weights.shape[axis])
            if head >= heads:
                raise ValueError(f"AttentionHeatmap: head_index={head} is out of range for {heads} heads")
            weights = weights.select(axis, head)
        return {"weights": weights, "labels": list(inputs.get("labels") or [])}


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)
