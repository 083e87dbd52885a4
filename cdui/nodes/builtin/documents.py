"""DocumentLoader: plain-text documents as ``{text, source}`` records, as CodefyUI's.

The head of a retrieval chain: each document keeps the name of the file it
came from, so a passage found later can be traced back. Like CodefyUI's it
reads ``.txt`` and ``.md`` only (UTF-8, a byte-order mark dropped) and refuses
anything else by name: a PDF read as text would be noise that still chunks and
embeds. It needs no extra. ``data/samples/rag`` is a small bundled corpus, so
the node's default runs with no setup.

Paths: ``directory`` is a plain folder path (a bare name is a folder under
``data/files`` when there is one, ``data/...`` the data folders, an absolute
path only under ``CODEFYUI_READ_ROOTS``, anything else relative to the
installation); ``file`` is an upload in ``data/files``.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdui.core.errors import PathRefused
from cdui.nodes.base import LIST, SCALAR, Param, Port
from cdui.nodes.builtin._declared import DeclaredNode
from cdui.nodes.builtin._util import as_bool

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

SOURCES = ["directory", "uploaded_file"]
TEXT_SUFFIXES = (".md", ".txt")
DEFAULT_DIRECTORY = "data/samples/rag"


def read_document(path: Path) -> str | None:
    """The text of ``path``, or None when it is blank (an empty document would become an empty passage)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"DocumentLoader: {path} is not valid UTF-8 (byte {exc.start} of the file); save it "
                         f"as UTF-8") from None
    return text if text.strip() else None


def max_docs(params: dict[str, Any]) -> int:
    raw = params.get("max_docs", 0) or 0
    try:
        return max(0, int(raw))
    except (TypeError, ValueError):
        raise ValueError(f"DocumentLoader: max_docs must be a whole number (0 = every document), "
                         f"got {params.get('max_docs')!r}") from None


class DocumentLoaderNode(DeclaredNode):
    NODE_NAME, CATEGORY = "DocumentLoader", "LLM"
    DESCRIPTION = "Read .txt and .md from a folder or upload, with source"
    OUTPUTS = (Port("documents", LIST, "list of {text, source} dicts"),
               Port("texts", LIST, "the same texts as plain strings"),
               Port("count", SCALAR, "How many documents were loaded."))
    PARAMS = (Param("source", "select", "directory", "Where the documents come from: a folder, or one uploaded file",
                    options=list(SOURCES)),
              Param("directory", "folder", DEFAULT_DIRECTORY,
                    "Folder of .txt/.md files (data/samples/rag is the bundled corpus)"),
              Param("recursive", "bool", False, "Also read subfolders", advanced=True),
              Param("file", "data_file", "", "A .txt or .md you uploaded"),
              Param("max_docs", "int", 0, "Keep at most this many documents, in name order (0 = all)",
                    min_value=0))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        source = str(params.get("source") or "directory")
        if source not in SOURCES:
            raise ValueError(f"DocumentLoader: unknown source {source!r}; set `source` to one of {SOURCES}")
        limit = max_docs(params)
        if source == "uploaded_file":
            documents, where = self._load_file(params, limit, ctx)
        else:
            documents, where = self._load_directory(params, limit, ctx)
        texts = [d["text"] for d in documents]
        noun = "document" if len(documents) == 1 else "documents"
        ctx.log(f"loaded {len(documents)} {noun} ({sum(map(len, texts)):,} chars) from {where}")
        return {"documents": documents, "texts": texts, "count": len(documents)}

    @staticmethod
    def _load_directory(params: dict[str, Any], limit: int, ctx: RunContext) -> tuple[list[dict[str, str]], str]:
        value = str(params.get("directory", DEFAULT_DIRECTORY) or "").strip()
        if not value:
            raise ValueError(f"DocumentLoader has no folder set: put a path in `directory` (the bundled corpus "
                             f"is {DEFAULT_DIRECTORY}), or switch `source` to uploaded_file")
        v = value.replace("\\", "/")
        root = None
        if "/" not in v and v not in (".", ".."):  # a bare name: a folder under data/files, as the upload list names
            in_files = ctx.resolve_upload("files", v)
            root = in_files if in_files.is_dir() else None
        root = root or ctx.resolve(v)
        if not root.is_dir():
            raise FileNotFoundError(f"DocumentLoader: no folder at {value!r} (looked at {root}); check `directory`")
        walk = root.rglob if as_bool(params.get("recursive"), False) else root.glob
        # Sorted by the source each document carries, so max_docs keeps the same ones on every machine.
        paths = sorted((p for p in walk("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES),
                       key=lambda p: p.relative_to(root).as_posix())
        if not paths:
            raise FileNotFoundError(f"DocumentLoader found no .txt or .md files in {root}")
        documents: list[dict[str, str]] = []
        base = root.resolve()
        for path in paths:
            # Each file is held to the folder's rules: no link out of it, nothing in a user data or .git folder.
            if base not in path.resolve().parents:
                raise PathRefused(str(path), "it leads outside its folder through a symbolic link")
            ctx.layout.check_not_private(path, str(path))
            text = read_document(path)
            if text is None:
                continue
            documents.append({"text": text, "source": path.relative_to(root).as_posix()})
            if limit and len(documents) >= limit:
                break
        if not documents:
            raise FileNotFoundError(f"DocumentLoader found only blank files in {root}: every .txt and .md there is "
                                    f"empty or whitespace, so there is nothing to chunk")
        return documents, value

    @staticmethod
    def _load_file(params: dict[str, Any], limit: int, ctx: RunContext) -> tuple[list[dict[str, str]], str]:
        value = str(params.get("file") or "").strip()
        if not value:
            raise ValueError("DocumentLoader has no file selected: pick one in `file` (upload a .txt or .md), "
                             "or switch `source` to directory")
        path = ctx.resolve_upload("files", value)
        if not path.is_file():
            raise FileNotFoundError(f"DocumentLoader: no file at {value!r} (looked at {path}); check `file`")
        suffix = path.suffix.lower()
        if suffix not in TEXT_SUFFIXES:
            raise ValueError(f"DocumentLoader: {path.name} is not plain text ({suffix or 'no suffix'}); this node "
                             f"reads .md and .txt only: convert it once outside the graph and upload the text")
        text = read_document(path)
        if text is None:
            raise FileNotFoundError(f"DocumentLoader: the file is blank: {path.name} is empty or whitespace only, "
                                    f"so there is nothing to chunk")
        documents = [{"text": text, "source": path.name}]
        return (documents[:limit] if limit else documents), path.name
