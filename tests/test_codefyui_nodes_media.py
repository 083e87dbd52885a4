"""VideoWrite, VideoLoad, DocumentLoader and LMTokenizedDataset: the four nodes of
CodefyUI's node library that its 1.4.2 catalog lacks (so they are not in
tests/data/codefyui_node_interfaces.json). Their interface is checked against
CodefyUI's own declarations, copied below as facts, and each runs on tiny data
the test makes: a few frames of video, a few text files, a small corpus."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cdui.core.errors import PathRefused
from cdui.core.layout import Layout
from cdui.graph.context import RunContext, RunStopped
from cdui.nodes import base
from cdui.nodes.base import Node, file_usage
from cdui.nodes.builtin.documents import DocumentLoaderNode
from cdui.nodes.builtin.lm_dataset import LMTokenizedDatasetNode
from cdui.nodes.builtin.video import VideoLoadNode, VideoWriteNode
from cdui.nodes.registry import build_registry

# CodefyUI's declarations (backend/app/nodes/io/video_*_node.py, llm/document_loader_node.py,
# llm/lm_tokenized_dataset_node.py): inputs and outputs as (name, type, optional); params as
# name -> (type, default, min, max, options). cdui's file types refine CodefyUI's "string".
INTERFACES: dict[str, dict[str, Any]] = {
    "VideoWrite": {"category": "IO", "inputs": [("frames", "TENSOR", False)],
                   "outputs": [("video", "ANY"), ("path", "STRING"), ("preview", "STRING")],
                   "params": {"filename": ("string", "clip", None, None, None),
                              "format": ("select", "auto", None, None, ["auto", "mp4", "gif"]),
                              "fps": ("float", 10.0, 0.5, 60.0, None), "resize": ("int", 0, 0, None, None)}},
    "VideoLoad": {"category": "IO", "inputs": [("path", "STRING", True)],
                  "outputs": [("frames", "TENSOR"), ("fps", "SCALAR"), ("num_frames", "SCALAR")],
                  "params": {"path": ("string", "clip.mp4", None, None, None), "max_frames": ("int", 0, 0, None, None),
                             "stride": ("int", 1, 1, None, None)}},
    "DocumentLoader": {"category": "LLM", "inputs": [],
                       "outputs": [("documents", "LIST"), ("texts", "LIST"), ("count", "SCALAR")],
                       "params": {"source": ("select", "directory", None, None, ["directory", "uploaded_file"]),
                                  "directory": ("string", "data/samples/rag", None, None, None),
                                  "recursive": ("bool", False, None, None, None),
                                  "file": ("data_file", "", None, None, None),
                                  "max_docs": ("int", 0, 0, None, None)}},
    "LMTokenizedDataset": {"category": "LLM", "inputs": [("dataset", "DATASET", False), ("tokenizer", "ANY", False)],
                           "outputs": [("dataset", "DATASET"), ("total_tokens", "SCALAR"), ("num_blocks", "SCALAR")],
                           "params": {"seq_len": ("int", 1024, 16, 8192, None),
                                      "append_eos": ("bool", True, None, None, None),
                                      "max_tokens": ("int", 0, 0, None, None),
                                      "cache": ("bool", True, None, None, None),
                                      "cache_dir": ("string", "", None, None, None)}},
}
FILE_TYPES = {"path", "folder", "output_path"}


@pytest.mark.parametrize("type_name", sorted(INTERFACES))
def test_interface_matches_codefyui(type_name: str) -> None:
    cls = build_registry().get(type_name)
    assert cls is not None, f"{type_name} is not registered"
    want, have = INTERFACES[type_name], cls.describe()
    assert have["category"] == want["category"]
    assert [(p["name"], p["type"], p["optional"]) for p in have["inputs"]] == want["inputs"]
    assert [(p["name"], p["type"]) for p in have["outputs"]] == want["outputs"]
    params = {p["name"]: p for p in have["params"]}
    assert list(params) == list(want["params"])
    for name, (ptype, default, lo, hi, options) in want["params"].items():
        p = params[name]
        assert p["type"] == ptype or (ptype == "string" and p["type"] in FILE_TYPES), name
        assert (p["default"], p.get("min"), p.get("max"), p.get("options")) == (default, lo, hi, options), name


@pytest.fixture
def events() -> list[tuple[str, dict[str, Any]]]:
    return []


@pytest.fixture
def ctx(tmp_path: Path, events: list[tuple[str, dict[str, Any]]]) -> RunContext:
    return RunContext("run-1", Layout.for_data_dir(tmp_path / "data", install_root=tmp_path),
                      emit=lambda kind, data: events.append((kind, data)))


def run(cls: type[Node], ctx: RunContext, inputs: dict[str, Any] | None = None, **params: Any) -> dict[str, Any]:
    merged = {p.name: p.default for p in cls.define_params()}
    merged.update(params)
    ctx.node_id, ctx.node_type = cls.NODE_NAME.lower(), cls.NODE_NAME
    return cls().execute(inputs or {}, merged, ctx)


# -- video ---------------------------------------------------------------------------------------
def clip(t: int = 4, h: int = 6, w: int = 8) -> torch.Tensor:
    """Frames of flat colours (exact in a GIF palette), each frame another colour."""
    colours = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    return torch.stack([colours[i % 4].view(3, 1, 1).expand(3, h, w) for i in range(t)])


def test_gif_round_trip_through_the_media_folder(ctx: RunContext, tmp_path: Path,
                                                events: list[tuple[str, dict[str, Any]]]) -> None:
    frames = clip()
    out = run(VideoWriteNode, ctx, {"frames": frames}, filename="rollouts/ep1", format="gif", fps=5.0)
    media = tmp_path / "data" / "media"
    assert Path(out["path"]) == (media / "rollouts" / "ep1.gif").resolve()
    video = out["video"]
    assert {k: video[k] for k in ("path", "format", "fps", "frames", "width", "height")} == \
        {"path": "rollouts/ep1.gif", "format": "gif", "fps": 5.0, "frames": 4, "width": 8, "height": 6}
    assert video["bytes"] == Path(out["path"]).stat().st_size
    assert [(d["kind"], d["name"]) for k, d in events if k == "artifact"] == [("media", "rollouts/ep1.gif")]
    assert out["preview"].startswith("iVBOR")  # a base64 PNG
    back = run(VideoLoadNode, ctx, path="rollouts/ep1.gif")
    assert back["frames"].shape == (4, 3, 6, 8) and back["num_frames"] == 4 and back["fps"] == pytest.approx(5.0)
    assert torch.allclose(back["frames"], frames, atol=1 / 255)
    strided = run(VideoLoadNode, ctx, {"path": str(Path(out["path"]))}, path="ignored.gif", stride=2, max_frames=1)
    assert strided["num_frames"] == 1 and strided["fps"] == pytest.approx(2.5)
    assert torch.allclose(strided["frames"][0], frames[0], atol=1 / 255)


@pytest.mark.parametrize("frames", [
    torch.zeros(2, 5, 4, 3, dtype=torch.uint8),  # (T, H, W, C) uint8
    torch.zeros(2, 1, 5, 4),                       # grey (T, 1, H, W)
])
def test_video_write_takes_codefyuis_frame_layouts(ctx: RunContext, frames: torch.Tensor) -> None:
    out = run(VideoWriteNode, ctx, {"frames": frames}, format="gif", resize=10)
    assert (out["video"]["height"], out["video"]["width"], out["video"]["frames"]) == (10, 8, 2)


@pytest.mark.parametrize("frames, message", [
    (torch.zeros(2, 4, 4), "4-D"),
    (torch.zeros(2, 4, 4, 4), "channel count"),
    (torch.zeros(0, 3, 4, 4), "zero frames"),
    ([1, 2], "must be a tensor"),
])
def test_video_write_refuses_what_is_not_frames(ctx: RunContext, frames: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run(VideoWriteNode, ctx, {"frames": frames}, format="gif")


def test_video_paths_stay_in_their_folders(ctx: RunContext, tmp_path: Path) -> None:
    with pytest.raises(PathRefused):
        run(VideoWriteNode, ctx, {"frames": clip()}, filename="../../escape", format="gif")
    with pytest.raises(PathRefused):
        run(VideoLoadNode, ctx, path="/etc/passwd.gif")
    with pytest.raises(FileNotFoundError, match="none.gif"):
        run(VideoLoadNode, ctx, path="none.gif")


def test_mp4_round_trip_with_pyav(ctx: RunContext) -> None:
    """MP4 through PyAV (the video extra, in the test extras): odd sizes are cropped to even ones, as H.264
    needs, and `auto` picks mp4 where PyAV is installed."""
    frames = clip(6, 7, 9)
    out = run(VideoWriteNode, ctx, {"frames": frames}, filename="c", fps=12.0)
    assert out["video"]["format"] == "mp4" and (out["video"]["height"], out["video"]["width"]) == (6, 8)
    back = run(VideoLoadNode, ctx, path="c.mp4")
    assert back["frames"].shape == (6, 3, 6, 8) and back["fps"] == pytest.approx(12.0)
    # lossy: the flat colours come back close, not exact
    assert (back["frames"] - frames[:, :, :6, :8]).abs().mean() < 0.1


def test_without_pyav_mp4_is_refused_and_auto_writes_gif(ctx: RunContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without the video extra: format mp4 is refused at validation with the install command,
    `auto` falls back to gif, and reading an mp4 says what to install."""
    monkeypatch.setitem(base._AVAILABLE, "av", False)
    found = VideoWriteNode.preflight({"format": "mp4"}, ctx.layout)
    assert [code for code, _ in found] == ["missing_extra"] and "bin/cdui start --extras video" in found[0][1]
    assert VideoWriteNode.preflight({"format": "auto"}, ctx.layout) == []
    assert run(VideoWriteNode, ctx, {"frames": clip()}, filename="x")["video"]["format"] == "gif"
    (ctx.layout.folder("media") / "y.mp4").write_bytes(b"\0")
    with pytest.raises(ValueError, match="--extras video"):
        run(VideoLoadNode, ctx, path="y.mp4")


def test_video_nodes_declare_their_writes_and_reads() -> None:
    """VideoWrite writes (the run's file plan says so); VideoLoad reads a plain path."""
    assert file_usage(VideoWriteNode, {}).writes == ["VideoWrite writes 'clip'"]
    assert file_usage(VideoLoadNode, {"path": "c.mp4"}).plain_paths == ["c.mp4"]
    assert file_usage(VideoLoadNode, {"path": "/datasets/c.mp4"}).absolute_reads == ["/datasets/c.mp4"]


# -- documents -----------------------------------------------------------------------------------
@pytest.fixture
def notes(tmp_path: Path) -> Path:
    folder = tmp_path / "data" / "files" / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_bytes("\ufeffsecond".encode())  # a byte-order mark is dropped
    (folder / "a.md").write_text("# first\n")
    (folder / "blank.txt").write_text("  \n")
    (folder / "paper.pdf").write_bytes(b"%PDF-1.4")
    (folder / "sub" / "c.MD").write_text("third")
    return folder


def test_document_loader_reads_text_files_in_name_order(ctx: RunContext, notes: Path) -> None:
    out = run(DocumentLoaderNode, ctx, directory="notes")  # a bare name: the folder under data/files
    assert out["documents"] == [{"text": "# first\n", "source": "a.md"}, {"text": "second", "source": "b.txt"}]
    assert out["texts"] == ["# first\n", "second"] and out["count"] == 2
    deep = run(DocumentLoaderNode, ctx, directory="data/files/notes", recursive=True, max_docs=3)
    assert [d["source"] for d in deep["documents"]] == ["a.md", "b.txt", "sub/c.MD"]
    assert run(DocumentLoaderNode, ctx, directory="notes", max_docs=1)["count"] == 1


def test_document_loader_default_is_the_bundled_corpus(ctx: RunContext) -> None:
    out = run(DocumentLoaderNode, ctx)
    assert [d["source"] for d in out["documents"]] == ["graphs-and-runs.md", "retrieval.txt", "training-basics.md"]
    assert all(d["text"].strip() for d in out["documents"])


def test_document_loader_reads_one_upload(ctx: RunContext, notes: Path) -> None:
    (notes.parent / "q.txt").write_text("question")
    out = run(DocumentLoaderNode, ctx, source="uploaded_file", file="q.txt")
    assert out["documents"] == [{"text": "question", "source": "q.txt"}]


@pytest.mark.parametrize("params, error, message", [
    ({"source": "uploaded_file", "file": "notes/paper.pdf"}, ValueError, r"not plain text \(\.pdf\)"),
    ({"source": "uploaded_file", "file": "notes/blank.txt"}, FileNotFoundError, "blank"),
    ({"source": "uploaded_file", "file": ""}, ValueError, "no file selected"),
    ({"source": "uploaded_file", "file": "missing.txt"}, FileNotFoundError, "no file at 'missing.txt'"),
    ({"source": "web"}, ValueError, "unknown source 'web'"),
    ({"directory": ""}, ValueError, "no folder set"),
    ({"directory": "data/files/nowhere"}, FileNotFoundError, "no folder at 'data/files/nowhere'"),
    ({"directory": "data/files/notes/sub/.."}, PathRefused, "'..'"),
    ({"max_docs": "two"}, ValueError, "max_docs must be a whole number"),
])
def test_document_loader_refusals(ctx: RunContext, notes: Path, params: dict[str, Any], error: type[Exception],
                                  message: str) -> None:
    with pytest.raises(error, match=message):
        run(DocumentLoaderNode, ctx, **params)


def test_document_loader_refuses_bad_text_and_empty_folders(ctx: RunContext, notes: Path) -> None:
    (notes / "sub" / "bad.txt").write_bytes(b"ok \xff")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        run(DocumentLoaderNode, ctx, directory="notes", recursive=True)
    only_blank = notes.parent / "blank"
    only_blank.mkdir()
    (only_blank / "x.txt").write_text("\n")
    with pytest.raises(FileNotFoundError, match="only blank files"):
        run(DocumentLoaderNode, ctx, directory="blank")
    (notes.parent / "none").mkdir()
    with pytest.raises(FileNotFoundError, match="no .txt or .md files"):
        run(DocumentLoaderNode, ctx, directory="none")


# -- LM token blocks -----------------------------------------------------------------------------
class CharTokenizer:
    """A tokenizer as CodefyUI's LMTokenizer hands over (encode and eos_id; encode_batch is optional)."""
    encoding_name = "chars"
    eos_id = 0

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str) -> list[int]:
        self.calls += 1
        return [ord(c) - 96 for c in text]  # a=1, b=2, ...


CORPUS = ["abcdefghij", "klmnopq", "rstuvwxyz", "abc"]  # 10+7+9+3 letters, +4 EOS = 33 tokens


def expected_stream() -> list[int]:
    out: list[int] = []
    for row in CORPUS:
        out += [ord(c) - 96 for c in row] + [0]
    return out


def test_lm_blocks_are_shifted_pairs_and_are_cached(ctx: RunContext, tmp_path: Path) -> None:
    tok = CharTokenizer()
    out = run(LMTokenizedDatasetNode, ctx, {"dataset": CORPUS, "tokenizer": tok}, seq_len=16)
    stream = expected_stream()
    assert (out["total_tokens"], out["num_blocks"]) == (33, 1)  # 33 // 17 blocks of seq_len + 1
    x, y = out["dataset"][0]
    assert x.dtype == torch.int64 and x.tolist() == stream[:16] and y.tolist() == stream[1:17]
    cached = list((tmp_path / "data" / "lm_token_cache").glob("lmpack-*.pt"))
    assert len(cached) == 1
    # the rerun loads the blocks: the tokenizer is not called again
    calls = tok.calls
    again = run(LMTokenizedDatasetNode, ctx, {"dataset": CORPUS, "tokenizer": tok}, seq_len=16)
    assert tok.calls == calls and again["dataset"][0][0].tolist() == stream[:16] and again["total_tokens"] == 33
    batch = next(iter(torch.utils.data.DataLoader(again["dataset"], batch_size=1)))
    assert batch[0].shape == (1, 16) and batch[0].dtype == torch.int64


def test_lm_blocks_without_eos_cache_or_beyond_max_tokens(ctx: RunContext, tmp_path: Path) -> None:
    out = run(LMTokenizedDatasetNode, ctx, {"dataset": CORPUS * 2, "tokenizer": CharTokenizer()}, seq_len=16,
              append_eos=False, cache=False, max_tokens=40)
    letters = [ord(c) - 96 for c in "".join(CORPUS * 2)]
    assert (out["total_tokens"], out["num_blocks"]) == (40, 2)
    assert out["dataset"][1][0].tolist() == letters[17:33]
    assert not (tmp_path / "data" / "lm_token_cache").exists()
    run(LMTokenizedDatasetNode, ctx, {"dataset": CORPUS, "tokenizer": CharTokenizer()}, seq_len=16,
        cache_dir="data/my-cache")
    assert len(list((tmp_path / "data" / "my-cache").glob("lmpack-*.pt"))) == 1


@pytest.mark.parametrize("inputs, params, error, message", [
    ({"tokenizer": CharTokenizer()}, {}, ValueError, "requires a `dataset` input"),
    ({"dataset": CORPUS, "tokenizer": "gpt2"}, {}, ValueError, "requires a `tokenizer` input"),
    ({"dataset": [], "tokenizer": CharTokenizer()}, {}, ValueError, "no rows"),
    ({"dataset": CORPUS, "tokenizer": CharTokenizer()}, {"seq_len": 64}, ValueError, "too small: 33 tokens"),
    ({"dataset": CORPUS, "tokenizer": CharTokenizer()}, {"seq_len": 16, "cache_dir": "../outside"}, PathRefused,
     "'..'"),
])
def test_lm_blocks_refusals(ctx: RunContext, inputs: dict[str, Any], params: dict[str, Any],
                            error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        run(LMTokenizedDatasetNode, ctx, inputs, **params)


def test_lm_blocks_stop_when_the_run_is_stopped(ctx: RunContext) -> None:
    ctx.stop_event.set()
    with pytest.raises(RunStopped):
        run(LMTokenizedDatasetNode, ctx, {"dataset": CORPUS, "tokenizer": CharTokenizer()}, seq_len=16)
