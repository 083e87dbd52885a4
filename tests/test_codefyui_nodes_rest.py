"""The last of CodefyUI's built-in types: generated image datasets, Transform,
ImageBatchReader, the diffusion training loop, the LLM nodes and the datasets
read from local caches.

Each table checks a node against a reference computed another way: Pillow
for image reading and resizing, the ``tokenizers`` library for tokenizer
files, a hand-written DDPM step for the diffusion loss, the formula CodefyUI
uses for the generated images. Nothing here touches the network: tokenizer
files, caches and the chat server are written or started by the tests
(the chat server on a loopback port).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cdui.core.layout import Layout
from cdui.graph.context import RunContext, RunStopped
from cdui.graph.secrets import split_secrets
from cdui.graph.validate import validate_graph
from cdui.nodes.base import Node
from cdui.nodes.builtin import (
    diffusion_training,
    image_pipeline,
    llm_chat,
    llm_tokens,
    local_datasets,
    synthetic_images,
)
from cdui.nodes.builtin._torchlib.images import ImageFolder
from cdui.nodes.registry import Registry, build_registry


@pytest.fixture(scope="module")
def registry() -> Registry:
    return build_registry()


@pytest.fixture
def events() -> list[tuple[str, dict[str, Any]]]:
    return []


@pytest.fixture
def ctx(tmp_path: Path, events: list[tuple[str, dict[str, Any]]]) -> RunContext:
    (tmp_path / "data").mkdir()
    return RunContext("run-1", Layout.for_data_dir(tmp_path / "data"),
                      emit=lambda kind, data: events.append((kind, data)))


def run(node_cls: type[Node], ctx: RunContext, inputs: dict[str, Any] | None = None, **params: Any) -> dict[str, Any]:
    merged = {p.name: p.default for p in node_cls.define_params()}
    merged.update(params)
    return node_cls().execute(inputs or {}, merged, ctx)


def preflight(node_cls: type[Node], ctx: RunContext, **params: Any) -> list[tuple[str, str]]:
    merged = {p.name: p.default for p in node_cls.define_params()}
    merged.update(params)
    return node_cls.preflight(merged, ctx.layout)


def write_png(path: Path, array: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def pixels(seed: int, h: int, w: int, channels: int = 3) -> np.ndarray:
    shape = (h, w, channels) if channels > 1 else (h, w)
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


# -- generated datasets -------------------------------------------------------------------------
def test_synthetic_segmentation_draws_codefyuis_shapes_and_masks(ctx: RunContext) -> None:
    ds = run(synthetic_images.SyntheticSegmentationNode, ctx, image_size=32, n_samples=12, noise=0.0, seed=3)["dataset"]
    assert len(ds) == 12
    again = run(synthetic_images.SyntheticSegmentationNode, ctx, image_size=32, n_samples=12, noise=0.0,
                seed=3)["dataset"]
    other = run(synthetic_images.SyntheticSegmentationNode, ctx, image_size=32, n_samples=12, noise=0.0,
                seed=4)["dataset"]
    classes_seen = set()
    for i in range(12):
        image, mask = ds[i]
        assert (image.shape, image.dtype, mask.shape, mask.dtype) == ((1, 32, 32), torch.float32, (32, 32), torch.int64)
        # without noise the image is the mask drawn in CodefyUI's values: 0, 0.7 (circle), 1.0 (rectangle)
        expected = torch.tensor([0.0, 0.7, 1.0])[mask]
        assert torch.equal(image[0], expected)
        assert torch.equal(image, again[i][0]) and torch.equal(mask, again[i][1])
        classes_seen |= set(mask.unique().tolist())
    assert classes_seen == {0, 1, 2}
    assert any(not torch.equal(ds[i][1], other[i][1]) for i in range(12))
    # CodefyUI's draws from default_rng(seed), in its order, give the first mask
    rng = np.random.default_rng(3)
    rows, cols = np.mgrid[0:32, 0:32]
    want = np.zeros((32, 32), dtype=np.int64)
    for _ in range(int(rng.integers(1, 3))):
        if rng.random() < 0.5:
            r = int(rng.integers(4, 8))
            cy, cx = int(rng.integers(r, 32 - r)), int(rng.integers(r, 32 - r))
            want[(rows - cy) ** 2 + (cols - cx) ** 2 <= r * r] = 1
        else:
            h, w = int(rng.integers(5, 10)), int(rng.integers(5, 10))
            top, left = int(rng.integers(0, 32 - h)), int(rng.integers(0, 32 - w))
            want[top:top + h, left:left + w] = 2
    assert torch.equal(ds[0][1], torch.from_numpy(want))


def test_synthetic_segmentation_noise_is_clipped_and_spares_the_mask(ctx: RunContext) -> None:
    clean = run(synthetic_images.SyntheticSegmentationNode, ctx, image_size=16, n_samples=4, noise=0.0)["dataset"]
    noisy = run(synthetic_images.SyntheticSegmentationNode, ctx, image_size=16, n_samples=4, noise=0.3)["dataset"]
    assert float(noisy[0][0].min()) >= 0.0 and float(noisy[0][0].max()) <= 1.0
    assert not torch.equal(clean[0][0], noisy[0][0])
    # the noise is drawn after the shapes: the first mask is the same, later draws move on
    assert torch.equal(clean[0][1], noisy[0][1])


def test_synthetic_shapes_are_one_gaussian_blob_in_minus_one_to_one(ctx: RunContext) -> None:
    ds = run(synthetic_images.SyntheticShapesNode, ctx, image_size=12, n_samples=8, seed=5)["dataset"]
    rng = np.random.default_rng(5)
    rows, cols = np.mgrid[0:12, 0:12].astype("float32")
    for i in range(8):
        cy, cx = rng.uniform(4, 8), rng.uniform(4, 8)
        sigma = rng.uniform(12 / 5.0, 12 / 3.5)
        blob = np.exp(-(((rows - cy) ** 2 + (cols - cx) ** 2) / (2 * sigma * sigma))).astype("float32")
        image, label = ds[i]
        assert label == 0 and image.shape == (1, 12, 12)
        assert torch.equal(image[0], torch.from_numpy(blob * 2.0 - 1.0))
    assert float(ds[0][0].min()) >= -1.0 and float(ds[0][0].max()) <= 1.0


def test_a_generated_dataset_too_large_for_memory_is_refused_before_drawing(ctx: RunContext) -> None:
    with pytest.raises(ValueError, match="more than the .* a generated dataset may hold"):
        run(synthetic_images.SyntheticShapesNode, ctx, image_size=100_000, n_samples=100_000)


# -- Transform and ImageBatchReader ----------------------------------------------------------------
@pytest.fixture
def folder_dataset(ctx: RunContext) -> ImageFolder:
    root = ctx.layout.data_dir / "pets"
    write_png(root / "cat" / "a.png", pixels(1, 10, 14))
    write_png(root / "dog" / "b.png", pixels(2, 12, 9))
    return ImageFolder(root)


def test_transform_replaces_the_datasets_pipeline_in_place(ctx: RunContext, folder_dataset: ImageFolder) -> None:
    raw = torch.from_numpy(pixels(1, 10, 14)).permute(2, 0, 1)
    assert torch.equal(folder_dataset[0][0], raw.float() / 255)  # ToTensor, as torchvision's ImageFolder gives
    out = run(image_pipeline.TransformNode, ctx, {"dataset": folder_dataset})["dataset"]
    assert out is folder_dataset  # the same object: every consumer of the dataset sees the change
    assert torch.equal(out[0][0], (raw.float() / 255 - 0.5) / 0.5) and out[0][1] == 0
    run(image_pipeline.TransformNode, ctx, {"dataset": folder_dataset}, normalize=False)
    assert torch.equal(folder_dataset[0][0], raw.float() / 255)
    before = folder_dataset.transform
    run(image_pipeline.TransformNode, ctx, {"dataset": folder_dataset}, normalize=False, to_tensor=False)
    assert folder_dataset.transform is before  # all three steps off: the transform is left as it was


def test_transform_resize_agrees_with_pillows_within_one_level(ctx: RunContext, folder_dataset: ImageFolder) -> None:
    from PIL import Image

    run(image_pipeline.TransformNode, ctx, {"dataset": folder_dataset}, resize=6, normalize=False)
    mine = folder_dataset[1][0]
    ref = np.asarray(Image.fromarray(pixels(2, 12, 9)).resize((6, 6), Image.Resampling.BILINEAR))
    ref_t = torch.from_numpy(ref.copy()).permute(2, 0, 1).float() / 255
    assert mine.shape == (3, 6, 6)
    assert float((mine - ref_t).abs().max()) <= 1 / 255 + 1e-6


def test_transform_on_the_offline_dataset_gets_its_8_bit_images(ctx: RunContext) -> None:
    from cdui.nodes.offline_datasets import OfflineImageDataset

    images = torch.arange(2 * 4 * 4, dtype=torch.uint8).reshape(2, 4, 4) * 7
    ds = OfflineImageDataset(images, torch.tensor([3, 1]), [str(i) for i in range(10)], "MNIST", "train")
    assert torch.equal(ds[0][0], (images[0][None].float() / 255 - 0.5) / 0.5)
    run(image_pipeline.TransformNode, ctx, {"dataset": ds}, normalize=False)
    assert torch.equal(ds[0][0], images[0][None].float() / 255) and ds[1][1] == 1


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_image_batch_reader_is_pillows_resize_bit_for_bit(ctx: RunContext, mode: str) -> None:
    from PIL import Image

    folder = ctx.layout.data_dir / "shots"
    for i, (h, w) in enumerate([(20, 30), (16, 16), (9, 25)]):
        write_png(folder / f"img{i}.png", pixels(10 + i, h, w))
    (folder / "notes.txt").write_text("not an image")
    out = run(image_pipeline.ImageBatchReaderNode, ctx, directory="shots", resize=8, mode=mode, max_images=2)
    assert out["count"] == 2 and out["images"].shape == (2, len(mode), 8, 8)
    for i in range(2):
        ref = np.asarray(Image.open(folder / f"img{i}.png").convert(mode).resize((8, 8), Image.Resampling.BILINEAR))
        ref_t = torch.from_numpy(ref.copy()).reshape(8, 8, len(mode)).permute(2, 0, 1).float() / 255
        assert torch.equal(out["images"][i], ref_t)
    assert run(image_pipeline.ImageBatchReaderNode, ctx, directory="data/shots", resize=4)["count"] == 3


def test_image_batch_reader_reads_nothing_outside_its_folder(ctx: RunContext, tmp_path: Path) -> None:
    folder = ctx.layout.data_dir / "shots"
    write_png(folder / "ok.png", pixels(1, 4, 4))
    write_png(tmp_path / "outside" / "secret.png", pixels(2, 4, 4))
    (folder / "link.png").symlink_to(tmp_path / "outside" / "secret.png")
    out = run(image_pipeline.ImageBatchReaderNode, ctx, directory="shots", resize=4)
    assert out["count"] == 1
    with pytest.raises(ValueError, match="without '/' or '..'"):
        run(image_pipeline.ImageBatchReaderNode, ctx, directory="shots", pattern="../outside/*.png")
    with pytest.raises(Exception, match="absolute paths are read only under the folders CODEFYUI_READ_ROOTS lists"):
        run(image_pipeline.ImageBatchReaderNode, ctx, directory=str(tmp_path / "outside"))
    [(code, message)] = preflight(image_pipeline.ImageBatchReaderNode, ctx, directory="nowhere")
    assert code == "missing_files" and "'nowhere' is not a folder on this machine" in message


# -- AttentionHeatmap ------------------------------------------------------------------------------------
W3 = torch.arange(2 * 3 * 3, dtype=torch.float32).reshape(2, 3, 3)


@pytest.mark.parametrize(("weights", "head", "expected"), [
    (W3[0], 1, W3[0]),  # 2-D: head_index means nothing, all of it is kept
    (W3, -1, W3),
    (W3, 1, W3[1]),
    (W3[None].repeat(4, 1, 1, 1), 0, W3[None].repeat(4, 1, 1, 1)[:, 0]),
])
def test_attention_heatmap_passes_weights_or_one_head(ctx: RunContext, weights: torch.Tensor, head: int,
                                                      expected: torch.Tensor) -> None:
    out = run(llm_tokens.AttentionHeatmapNode, ctx, {"weights": weights}, head_index=head)
    assert torch.equal(out["weights"], expected) and out["labels"] == []
    labelled = run(llm_tokens.AttentionHeatmapNode, ctx, {"weights": [[0.5, 0.5]], "labels": ["a", "b"]})
    assert labelled["labels"] == ["a", "b"] and torch.equal(labelled["weights"], torch.tensor([[0.5, 0.5]]))


def test_attention_heatmap_head_out_of_range(ctx: RunContext) -> None:
    with pytest.raises(ValueError, match="head_index=2 is out of range for 2 heads"):
        run(llm_tokens.AttentionHeatmapNode, ctx, {"weights": W3}, head_index=2)


# -- Tokenizer --------------------------------------------------------------------------------------
def tiny_tokenizer_json(path: Path) -> Any:
    """A WordPiece tokenizer with BERT's special tokens, made by the tokenizers library itself."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "quick", "brown", "fox",
                                         "jump", "##s", "over", "lazy", "dog", "."])}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                              ("[SEP]", 3)])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok


def test_tokenizer_reads_a_local_tokenizer_json(ctx: RunContext) -> None:
    ref = tiny_tokenizer_json(ctx.layout.data_dir / "tokenizers" / "bert-base-uncased" / "tokenizer.json")
    assert preflight(llm_tokens.TokenizerNode, ctx, family="bert-base-uncased") == []
    out = run(llm_tokens.TokenizerNode, ctx, family="bert-base-uncased")
    want = ref.encode("The quick brown fox jumps over the lazy dog.", add_special_tokens=False)
    assert out["tokens"] == ["the", "quick", "brown", "fox", "jump", "##s", "over", "the", "lazy", "dog", "."]
    assert out["token_ids"] == want.ids and out["offsets"] == [list(o) for o in want.offsets]
    special = run(llm_tokens.TokenizerNode, ctx, {"text": ["Fox jumps", "ignored"]}, family="bert-base-uncased",
                  show_special_tokens=True)
    assert special["tokens"] == ["[CLS]", "fox", "jump", "##s", "[SEP]"]
    assert special["offsets"] == [[0, 0], [0, 3], [4, 8], [8, 9], [0, 0]]


def test_tokenizer_reads_the_hub_cache_snapshot(ctx: RunContext, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    repo = hub / "models--Xenova--llama-3-tokenizer"
    tiny_tokenizer_json(repo / "snapshots" / "abc123" / "tokenizer.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert run(llm_tokens.TokenizerNode, ctx, {"text": "lazy dog"}, family="Llama-3")["token_ids"] == [11, 12]


def test_a_missing_tokenizer_is_refused_at_validation_naming_the_file(
        ctx: RunContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-tiktoken"))
    [(code, message)] = preflight(llm_tokens.TokenizerNode, ctx, family="T5")
    assert code == "missing_tokenizer"
    assert f"put it at {ctx.layout.data_dir}/tokenizers/T5/tokenizer.json" in message
    assert "https://huggingface.co/google/t5-v1_1-base" in message
    [(code, message)] = preflight(llm_tokens.TokenizerNode, ctx, family="gpt2")
    assert code == "missing_tokenizer"
    assert ("download https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken on a connected "
            f"machine and put it at {ctx.layout.data_dir}/tokenizers/r50k_base.tiktoken") in message


def test_a_tiktoken_file_that_is_not_the_published_one_is_refused(ctx: RunContext) -> None:
    bad = ctx.layout.data_dir / "tokenizers" / "cl100k_base.tiktoken"
    bad.parent.mkdir(parents=True)
    bad.write_text("YQ== 0\nYg== 1\n")
    assert preflight(llm_tokens.TokenizerNode, ctx) == []  # present; its content is tiktoken's to judge
    with pytest.raises(ValueError, match="is not the published cl100k_base.tiktoken"):
        run(llm_tokens.TokenizerNode, ctx)


def test_a_missing_tokenizers_package_is_refused_naming_the_extra(
        registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from cdui.nodes import base

    monkeypatch.setitem(sys.modules, "tokenizers", None)
    monkeypatch.setattr(base, "_AVAILABLE", {})
    entry = next(n for n in registry.catalog() if n["type"] == "Tokenizer")
    assert (entry["available"], entry["extra"]) == (False, "tokenizers")
    graph = {"nodes": [{"id": "start", "type": "Start", "data": {}},
                       {"id": "tok", "type": "Tokenizer", "data": {"params": {"family": "bert-base-uncased"}}}],
             "edges": [{"source": "start", "sourceHandle": "trigger", "target": "tok", "type": "trigger"}]}
    _plan, errors = validate_graph(graph, registry, layout=Layout.for_data_dir(tmp_path))
    assert [e["code"] for e in errors] == ["missing_extra"]
    assert "`bin/cdui start --extras tokenizers`" in errors[0]["message"]


# -- the local dataset caches ----------------------------------------------------------------------------
def kaggle_cache(root: Path) -> Path:
    base = root / "datasets" / "someone" / "pets" / "versions"
    write_png(base / "1" / "images" / "cat" / "old.png", pixels(1, 5, 5))
    write_png(base / "2" / "images" / "cat" / "a.png", pixels(2, 6, 4))
    write_png(base / "2" / "images" / "dog" / "b.png", pixels(3, 6, 4))
    write_png(base / "2" / "images" / "dog" / "c.png", pixels(4, 6, 4))
    return base


def test_kaggle_dataset_reads_the_newest_cached_version_as_an_image_folder(ctx: RunContext) -> None:
    kaggle_cache(ctx.layout.data_dir / "kaggle")
    params = {"dataset_slug": "someone/pets", "subdir": "images", "cache_dir": "kaggle"}
    assert preflight(local_datasets.KaggleDatasetNode, ctx, **params) == []
    ds = run(local_datasets.KaggleDatasetNode, ctx, **params)["dataset"]
    assert ds.classes == ["cat", "dog"] and [ds[i][1] for i in range(3)] == [0, 1, 1]
    assert torch.equal(ds[2][0], torch.from_numpy(pixels(4, 6, 4)).permute(2, 0, 1).float() / 255)
    old = run(local_datasets.KaggleDatasetNode, ctx, **{**params, "dataset_slug": "someone/pets/versions/1"})
    assert len(old["dataset"]) == 1


def test_kaggle_dataset_missing_or_outside_its_cache_is_refused(ctx: RunContext, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path / "kagglehub"))
    [(code, message)] = preflight(local_datasets.KaggleDatasetNode, ctx, dataset_slug="someone/pets")
    assert code == "missing_dataset"
    assert f"not in kagglehub's cache (looked in {tmp_path}/kagglehub/datasets/someone/pets/versions)" in message
    assert "kagglehub.dataset_download('someone/pets')" in message
    for slug in ("../etc", "someone/pets/versions/../../x", "a/b/c"):
        [(code, _)] = preflight(local_datasets.KaggleDatasetNode, ctx, dataset_slug=slug)
        assert code == "bad_param", slug
    kaggle_cache(tmp_path / "kagglehub")
    [(code, message)] = preflight(local_datasets.KaggleDatasetNode, ctx, dataset_slug="someone/pets",
                                  subdir="../../../1")
    assert code == "bad_param" and "'..' is not allowed" in message


def hf_cache(cache: Path, scratch: Path) -> None:
    """A hub dataset ``someone/tiny`` as ``datasets`` leaves it in its cache after a download:
    prepared by datasets' own parquet builder from a local file, then filed under the hub id."""
    import datasets
    from PIL import Image

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    images = [Image.fromarray(pixels(20 + i, 5, 3)) for i in range(3)]
    source = scratch / "train.parquet"
    datasets.Dataset.from_dict({"image": images, "label": [0, 1, 0]}, features=features).to_parquet(str(source))
    builder = datasets.load_dataset_builder("parquet", data_files={"train": str(source)}, cache_dir=str(scratch))
    builder.download_and_prepare()
    [prepared] = (scratch / "parquet").glob("default-*/0.0.0/*/dataset_info.json")
    target = cache / "someone___tiny" / "default" / "0.0.0" / prepared.parent.name
    target.mkdir(parents=True)
    (target / "dataset_info.json").write_bytes(prepared.read_bytes())
    (target / "tiny-train.arrow").write_bytes((prepared.parent / "parquet-train.arrow").read_bytes())


@pytest.mark.e2e  # importing datasets (pyarrow, pandas) takes seconds
def test_hugging_face_dataset_reads_the_local_cache_offline(ctx: RunContext, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the fixture itself never reaches for the network
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "no-default-cache"))
    params = {"dataset_name": "someone/tiny", "cache_dir": "hf"}
    [(code, message)] = preflight(local_datasets.HuggingFaceDatasetNode, ctx, **params)
    assert code == "missing_dataset"
    assert (f"not in the datasets cache on this machine (looked for {ctx.layout.data_dir}/hf/someone___tiny/"
            "<config>/<version>/<hash>/dataset_info.json") in message
    assert "datasets.load_dataset('someone/tiny', cache_dir='hf-cache')" in message
    hf_cache(ctx.layout.data_dir / "hf", tmp_path / "scratch")
    assert preflight(local_datasets.HuggingFaceDatasetNode, ctx, **params) == []
    ds = run(local_datasets.HuggingFaceDatasetNode, ctx, **params)["dataset"]
    assert len(ds) == 3 and [ds[i][1] for i in range(3)] == [0, 1, 0]
    assert torch.equal(ds[1][0], torch.from_numpy(pixels(21, 5, 3)).permute(2, 0, 1).float() / 255)
    run(image_pipeline.TransformNode, ctx, {"dataset": ds})  # ToTensor + Normalize, as in CodefyUI
    assert torch.equal(ds[1][0], (torch.from_numpy(pixels(21, 5, 3)).permute(2, 0, 1).float() / 255 - 0.5) / 0.5)
    sliced = run(local_datasets.HuggingFaceDatasetNode, ctx, **params, split="train[:2]")["dataset"]
    assert len(sliced) == 2
    with pytest.raises(ValueError, match=r"column 'img' is not in someone/tiny; its columns are \['image', 'label'\]"):
        run(local_datasets.HuggingFaceDatasetNode, ctx, **params, image_column="img")


# -- LLMChat -------------------------------------------------------------------------------------------
class ChatServer:
    """A tiny OpenAI/Anthropic-compatible server on a loopback port, in a thread."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.status = status
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        from aiohttp import web

        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            self.requests.append((request.path, {k.lower(): v for k, v in request.headers.items()}, body))
            if self.status != 200:
                return web.json_response({"error": {"message": "invalid api key"}}, status=self.status)
            if request.path.endswith("/v1/messages"):
                return web.json_response({"content": [{"type": "text", "text": "claude says hi"}],
                                          "usage": {"input_tokens": 5, "output_tokens": 3}})
            return web.json_response({"choices": [{"message": {"role": "assistant", "content": "hello there"}}],
                                      "usage": {"prompt_tokens": 7, "completion_tokens": 2}})

        async def start() -> web.AppRunner:
            app = web.Application()
            app.router.add_post("/v1/chat/completions", chat)
            app.router.add_post("/v1/messages", chat)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            return runner

        asyncio.set_event_loop(self._loop)
        self._runner = self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())

    def __enter__(self) -> ChatServer:
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


KEY = "sk-test-0123456789abcdef"


@pytest.fixture(autouse=True)
def loopback_targets_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chat servers here are on loopback, which LLMChat may call only where this machine's
    operator allows it (tests/test_netguard.py shows the refusal)."""
    monkeypatch.setenv("CODEFYUI_NODE_NET_ALLOW_LOCAL", "*")


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    with ChatServer() as server:
        yield server


def test_llm_chat_sends_the_prompt_and_inputs_with_the_key_in_the_header(ctx: RunContext,
                                                                         chat_server: ChatServer) -> None:
    base = f"http://127.0.0.1:{chat_server.port}/v1"
    out = run(llm_chat.LLMChatNode, ctx, {"text": "some context", "array": [1, 2]}, openai_api_key=KEY,
              openai_base_url=base, model="m1", max_tokens=50, temperature=0.0)
    assert out == {"text": "hello there"}
    [(path, headers, body)] = chat_server.requests
    assert path == "/v1/chat/completions" and headers["authorization"] == f"Bearer {KEY}"
    assert body == {"model": "m1", "max_tokens": 50, "temperature": 0.0, "stream": False, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Summarize the provided input.\n\nsome context\n\nArray input:\n[\n  1,\n  2\n]"}]}


def test_llm_chat_ollama_and_claude_and_an_image(ctx: RunContext, chat_server: ChatServer) -> None:
    base = f"http://127.0.0.1:{chat_server.port}"
    out = run(llm_chat.LLMChatNode, ctx, {"image": torch.zeros(1, 2, 2)}, provider="Ollama",
              ollama_base_url=base + "/v1", prompt="")
    assert out["text"] == "hello there"
    _path, headers, body = chat_server.requests[-1]
    assert "authorization" not in headers
    content = body["messages"][1]["content"]
    assert content[0] == {"type": "text", "text": "Describe the image."}
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
    out = run(llm_chat.LLMChatNode, ctx, provider="Claude API", anthropic_api_key=KEY, anthropic_base_url=base,
              model="claude-x")
    path, headers, body = chat_server.requests[-1]
    assert (out["text"], path, headers["x-api-key"]) == ("claude says hi", "/v1/messages", KEY)
    assert body["system"] == "You are a helpful assistant." and body["messages"][0]["role"] == "user"


def test_llm_chat_unreachable_endpoint_and_refused_key_say_so_without_the_key(ctx: RunContext) -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RuntimeError, match=rf"could not reach http://127.0.0.1:{port}/v1/chat/completions: "
                                           r".*Connection ?[Rr]efused") as info:
        run(llm_chat.LLMChatNode, ctx, openai_api_key=KEY, openai_base_url=f"http://127.0.0.1:{port}/v1")
    assert KEY not in str(info.value)
    with ChatServer(status=401) as server:
        with pytest.raises(RuntimeError, match="answered HTTP 401: .*invalid api key") as info:
            run(llm_chat.LLMChatNode, ctx, openai_api_key=KEY, openai_base_url=f"http://127.0.0.1:{server.port}/v1")
    assert KEY not in str(info.value)
    with pytest.raises(ValueError, match="needs openai_api_key"):
        run(llm_chat.LLMChatNode, ctx, openai_base_url="http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="Codex provider .* not support"):
        run(llm_chat.LLMChatNode, ctx, provider="Codex")


def test_llm_chat_keys_are_secrets_split_from_the_graph(registry: Registry) -> None:
    graph = {"nodes": [{"id": "chat", "type": "LLMChat", "data": {"params": {"openai_api_key": KEY}}}], "edges": []}
    kept, secrets = split_secrets(graph, registry)
    assert KEY not in json.dumps(kept) and [v for _p, v in secrets] == [KEY]


# -- DiffusionTrainingLoop ---------------------------------------------------------------------------------
class TinyDenoiser(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.conv = torch.nn.Conv2d(1, 1, 3, padding=1)
        self.time = torch.nn.Embedding(10, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + self.time(t).view(-1, 1, 1, 1)


def reference_losses(dataset: Any, epochs: int, batch: int, steps: int, seed: int) -> list[float]:
    """DDPM training written out by hand: the loss the node must report."""
    from torch.utils.data import DataLoader

    model = TinyDenoiser()
    torch.manual_seed(seed)
    alpha_bars = torch.cumprod(1.0 - torch.linspace(0.0001, 0.05, steps), dim=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(dataset, batch_size=batch, shuffle=True)
    out = []
    for _ in range(epochs):
        total, n = 0.0, 0
        for x0, _label in loader:
            t = torch.randint(0, steps, (x0.shape[0],))
            eps = torch.randn_like(x0)
            ab = alpha_bars[t].view(-1, 1, 1, 1)
            loss = ((model(ab.sqrt() * x0 + (1 - ab).sqrt() * eps, t) - eps) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + loss.item(), n + 1
        out.append(total / n)
    return out


def test_diffusion_training_loop_is_ddpm_training_and_reports_each_epoch(
        ctx: RunContext, events: list[tuple[str, dict[str, Any]]]) -> None:
    data = synthetic_images.blob_samples(8, 8, seed=1)
    out = run(diffusion_training.DiffusionTrainingLoopNode, ctx, {"model": TinyDenoiser(), "dataset": data},
              epochs=3, batch_size=4, lr=0.01, num_timesteps=10, seed=2)
    want = reference_losses(data, 3, 4, 10, 2)
    assert out["losses"].tolist() == pytest.approx(want, rel=1e-5)
    epochs = [d for k, d in events if k == "progress" and d.get("event") == "epoch"]
    assert [(d["epoch"], d["epochs"]) for d in epochs] == [(1, 3), (2, 3), (3, 3)]
    assert epochs[-1]["losses"] == pytest.approx([round(v, 6) for v in want], rel=1e-4)
    assert [d["step"] for k, d in events if k == "metric" and d["name"] == "train_loss"] == [1, 2, 3]


def test_diffusion_training_loop_stops_with_an_interrupt_checkpoint(
        ctx: RunContext, events: list[tuple[str, dict[str, Any]]]) -> None:
    data = synthetic_images.blob_samples(8, 8, seed=1)
    original = ctx._emit

    def stop_after_first_epoch(kind: str, payload: dict[str, Any]) -> None:
        original(kind, payload)
        if kind == "progress" and payload.get("event") == "epoch":
            ctx.stop_event.set()

    ctx._emit = stop_after_first_epoch
    with pytest.raises(RunStopped):
        run(diffusion_training.DiffusionTrainingLoopNode, ctx, {"model": TinyDenoiser(), "dataset": data},
            epochs=50, batch_size=4, num_timesteps=10)
    saved = torch.load(ctx.layout.run_dir("run-1") / "checkpoints" / "interrupt.pt", weights_only=False)
    assert saved["epoch"] == 1 and set(saved["model_state_dict"]) == {"conv.weight", "conv.bias", "time.weight"}
    assert [d["kind"] for k, d in events if k == "artifact"] == ["checkpoint"]


@pytest.mark.e2e  # a U-Net trained and sampled: seconds on a busy CPU
def test_a_codefyui_diffusion_graph_trains_and_samples(registry: Registry, ctx: RunContext) -> None:
    """SyntheticShapes -> DiffusionUNet -> DiffusionTrainingLoop -> DDPMSampler, as CodefyUI's canvas wires them."""
    from cdui.graph.executor import Executor
    from cdui.graph.presets import preset_library

    def node(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
        return {"id": nid, "type": ntype, "data": {"params": params}}

    def edge(src: str, sh: str, dst: str, th: str) -> dict[str, Any]:
        return {"source": src, "sourceHandle": sh, "target": dst, "targetHandle": th}

    graph = {"nodes": [node("start", "Start"), node("shapes", "SyntheticShapes", image_size=8, n_samples=8),
                       node("unet", "DiffusionUNet", in_channels=1, base_channels=4, channel_mult="1,2",
                            time_emb_dim=8, num_groups=2),
                       node("train", "DiffusionTrainingLoop", epochs=2, batch_size=8, num_timesteps=4),
                       node("noise", "GaussianNoise", shape="1,1,8,8"),
                       node("sample", "DDPMSampler", num_steps=4)],
             "edges": [{"source": "start", "sourceHandle": "trigger", "target": t, "type": "trigger"}
                       for t in ("shapes", "unet", "noise")]
             + [edge("shapes", "dataset", "train", "dataset"), edge("unet", "model", "train", "model"),
                edge("train", "model", "sample", "model"), edge("noise", "noise", "sample", "noise")]}
    plan, errors = validate_graph(graph, registry, preset_library(), layout=ctx.layout)
    assert errors == [] and plan is not None
    results = Executor(registry, ctx).run(plan)
    assert results["train"]["losses"].shape == (2,) and results["sample"]["image"].shape == (1, 1, 8, 8)
