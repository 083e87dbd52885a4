"""HuggingFaceDataset and KaggleDataset, read from local caches only.

cdui never downloads (labs are often offline; CodefyUI downloads on first
use). A dataset fetched once on any machine by ``datasets.load_dataset`` or
``kagglehub.dataset_download`` is a folder that can be copied over; these
nodes read it from the caches those libraries fill:

- **HuggingFaceDataset** (the ``hf`` extra: ``datasets``) calls
  ``datasets.load_dataset`` with ``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE``
  set, so it reads the datasets cache (``cache_dir``, else ``HF_DATASETS_CACHE``,
  else ``HF_HOME/datasets``, else ``~/.cache/huggingface/datasets``) and never
  the network. Items are ``(ToTensor(image), label)``: float (C, H, W) in [0, 1]
  and the label as stored. A ``Transform`` downstream replaces the ToTensor.
- **KaggleDataset** reads kagglehub's cache (``cache_dir``, else
  ``KAGGLEHUB_CACHE``, else ``~/.cache/kagglehub``):
  ``datasets/<owner>/<name>/versions/<n>/`` -- the highest version present,
  or the one the slug names (``owner/name/versions/3``) -- plus ``subdir``, as
  an ImageFolder (``<class>/<image>``, classes in sorted order), items as
  ToTensor gives them. kagglehub itself is not needed.

A relative ``cache_dir`` is a folder under the data folder. A dataset that is
not there fails the graph at validation, naming the folder looked for and how
to fill it.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cdui.core.errors import CduiError
from cdui.core.paths import safe_join
from cdui.nodes.base import DATASET, Param, Port
from cdui.nodes.builtin._declared import DeclaredNode

if TYPE_CHECKING:  # pragma: no cover
    from cdui.core.layout import Layout
    from cdui.graph.context import RunContext

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
MAX_HF_ITEMS = 10_000_000


def _cache_folder(layout: Layout, value: Any, default: Path) -> Path:
    v = str(value or "").strip().replace("\\", "/").removeprefix("./")
    if not v:
        return default
    rel = v[5:] if v.startswith("data/") else v
    return layout.check_not_private(safe_join(layout.data_dir, rel), v)


def _repo_parts(node: str, value: str, what: str, max_parts: int) -> list[str]:
    parts = [p for p in str(value or "").strip().split("/") if p]
    if not parts or len(parts) > max_parts or not all(_NAME.match(p) and ".." not in p for p in parts):
        raise ValueError(f"{node}: {what} {value!r} is not a name like owner/dataset")
    return parts


# -- Hugging Face ---------------------------------------------------------------------------
def hf_cache(layout: Layout, params: dict[str, Any]) -> Path:
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    default = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets")
    return _cache_folder(layout, params.get("cache_dir"), default)


def hf_cached_folder(cache: Path, name: str) -> Path:
    """Where ``datasets`` keeps a hub dataset it has prepared: ``<owner>___<name>``
    (the name part in snake case, as ``datasets`` writes it)."""
    parts = _repo_parts("HuggingFaceDataset", name, "dataset_name", 2)
    # datasets' camel-to-snake rule: "MNISTData" -> "mnist_data", "myData" -> "my_data"
    last = re.sub(r"([a-z\d])([A-Z])", r"\1_\2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", parts[-1])).lower()
    return cache / "___".join([*parts[:-1], last])


def hf_missing(layout: Layout, params: dict[str, Any]) -> str | None:
    name = str(params.get("dataset_name") or "ylecun/mnist")
    cache = hf_cache(layout, params)
    folder = hf_cached_folder(cache, name)
    if folder.is_dir() and any(folder.glob("*/*/*/dataset_info.json")):
        return None
    return (f"Hugging Face dataset {name} is not in the datasets cache on this machine (looked for "
            f"{folder}/<config>/<version>/<hash>/dataset_info.json and its .arrow files). cdui never downloads: "
            f"run `python -c \"import datasets; datasets.load_dataset('{name}'"
            + (f", '{params.get('subset')}'" if params.get("subset") else "")
            + f", cache_dir='hf-cache')\"` on a connected machine, copy hf-cache/{folder.name} into {cache}, "
            f"or set the node's cache_dir to a folder under the data folder that holds it")


class HFImages:
    """A ``datasets`` split as (image tensor, label) items; ``transform`` is ToTensor until replaced."""

    def __init__(self, ds: Any, image_column: str, label_column: str) -> None:
        self.ds, self.image_column, self.label_column = ds, image_column, label_column
        self.transform: Any = None

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        import torch

        row = self.ds[int(index)]
        image = row[self.image_column]
        if hasattr(image, "convert"):  # a PIL image: its 8-bit pixels, as ToTensor reads them
            mode = image.mode if image.mode in ("L", "RGB", "RGBA") else "RGB"
            image = image.convert(mode)
            raw = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
            raw = raw.reshape(image.height, image.width, len(mode)).permute(2, 0, 1).contiguous()
        else:
            raw = torch.as_tensor(image)
            if raw.dim() == 2:
                raw = raw[None]
        if getattr(self.transform, "takes_raw", False):
            x = self.transform(raw)
        else:
            x = raw.to(torch.float32).div(255) if raw.dtype == torch.uint8 else raw.float()
            if self.transform is not None:
                x = self.transform(x)
        return x, row[self.label_column]

    def __repr__(self) -> str:
        return f"<Hugging Face dataset, {len(self)} rows>"


class HuggingFaceDatasetNode(DeclaredNode):
    NODE_NAME, CATEGORY = "HuggingFaceDataset", "Data"
    CACHEABLE = False  # reads the network
    DESCRIPTION = "An image-classification dataset from the local Hugging Face datasets cache (never downloaded)"
    NEEDS: ClassVar[tuple[str, ...]] = ("datasets", "PIL")
    EXTRA: ClassVar[str | None] = "hf"
    OUTPUTS = (Port("dataset", DATASET, "(image (C, H, W) in [0, 1], label) pairs"),)
    PARAMS = (Param("dataset_name", "string", "ylecun/mnist", "Hub repo id (e.g. ylecun/mnist, uoft-cs/cifar10)"),
              Param("subset", "string", "", "Config name of a multi-config dataset (empty: none)"),
              Param("split", "string", "train", "Split: train/test/validation, or a slice such as train[:1000]"),
              Param("image_column", "string", "image", "Column holding the image"),
              Param("label_column", "string", "label", "Column holding the label"),
              Param("cache_dir", "string", "", "datasets cache folder under the data folder (empty: the HF default)"))

    @classmethod
    def preflight(cls, params: dict[str, Any], layout: Layout) -> list[tuple[str, str]]:
        problems = super().preflight(params, layout)
        if problems:
            return problems
        try:
            message = hf_missing(layout, params)
        except CduiError as exc:
            return [("bad_param", f"cache_dir: {exc.message}")]
        except ValueError as exc:
            return [("bad_param", str(exc))]
        return [("missing_dataset", message)] if message else []

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        name = str(params.get("dataset_name") or "ylecun/mnist")
        cache = hf_cache(ctx.layout, params)
        message = hf_missing(ctx.layout, params)
        if message:
            raise ValueError(message)
        # Offline before datasets reads its settings; a process that imported it already is told too.
        os.environ["HF_DATASETS_OFFLINE"] = "1"
        os.environ["HF_HUB_OFFLINE"] = "1"
        import datasets

        datasets.config.HF_DATASETS_OFFLINE = True
        datasets.config.HF_HUB_OFFLINE = True
        image_column = str(params.get("image_column") or "image")
        label_column = str(params.get("label_column") or "label")
        ds = datasets.load_dataset(name, str(params.get("subset") or "") or None,
                                   split=str(params.get("split") or "train"), cache_dir=str(cache))
        columns = list(ds.features.keys()) if hasattr(ds, "features") else []
        for column in (image_column, label_column):
            if column not in columns:
                raise ValueError(f"HuggingFaceDataset: column {column!r} is not in {name}; its columns are {columns}")
        if len(ds) > MAX_HF_ITEMS:
            raise ValueError(f"HuggingFaceDataset: {name} has {len(ds):,} rows, more than {MAX_HF_ITEMS:,}")
        ctx.log(f"HuggingFaceDataset: {name} ({params.get('split') or 'train'}), {len(ds)} rows from {cache}")
        return {"dataset": HFImages(ds, image_column, label_column)}


# -- Kaggle -------------------------------------------------------------------------------------
def kaggle_root(layout: Layout, params: dict[str, Any]) -> tuple[Path, str | None]:
    """The folder a slug names in kagglehub's cache (plus subdir), and why it is missing (None: present)."""

    slug = str(params.get("dataset_slug") or "").strip()
    if not slug:
        raise ValueError("KaggleDataset: dataset_slug is required (owner/dataset, as on kaggle.com)")
    parts = _repo_parts("KaggleDataset", slug, "dataset_slug", 4)
    if len(parts) == 3 or (len(parts) == 4 and (parts[2] != "versions" or not parts[3].isdigit())):
        raise ValueError(f"KaggleDataset: dataset_slug {slug!r} is not owner/dataset or owner/dataset/versions/N")
    default = Path(os.environ.get("KAGGLEHUB_CACHE") or Path.home() / ".cache" / "kagglehub")
    cache = _cache_folder(layout, params.get("cache_dir"), default)
    versions = cache / "datasets" / parts[0] / parts[1] / "versions"
    get = (f"cdui never downloads: run `python -c \"import kagglehub; kagglehub.dataset_download('{slug}')\"` on a "
           f"connected machine and copy its ~/.cache/kagglehub/datasets/{parts[0]}/{parts[1]} to "
           f"{cache / 'datasets' / parts[0] / parts[1]}")
    if len(parts) == 4:
        version = versions / parts[3]
    else:
        present = sorted((int(p.name) for p in versions.iterdir() if p.is_dir() and p.name.isdigit())
                         if versions.is_dir() else [])
        if not present:
            return versions / "<n>", f"Kaggle dataset {slug} is not in kagglehub's cache (looked in {versions}). {get}"
        version = versions / str(present[-1])
    subdir = str(params.get("subdir") or "").strip()
    root = safe_join(version, subdir) if subdir else version
    if not root.is_dir():
        return root, f"Kaggle dataset {slug}: {root} is not a folder on this machine. {get}"
    if not any(p.is_dir() for p in root.iterdir()):
        return root, (f"Kaggle dataset {slug}: {root} has no class folders (<class>/<image>); set subdir to the "
                      f"folder that holds them")
    return root, None


class KaggleDatasetNode(DeclaredNode):
    NODE_NAME, CATEGORY = "KaggleDataset", "Data"
    CACHEABLE = False  # reads the network
    DESCRIPTION = "An image-folder dataset from the local kagglehub cache (never downloaded)"
    NEEDS: ClassVar[tuple[str, ...]] = ("PIL",)
    EXTRA: ClassVar[str | None] = "vision"
    OUTPUTS = (Port("dataset", DATASET, "(image (3, H, W) in [0, 1], class index) pairs"),)
    PARAMS = (Param("dataset_slug", "string", "", "owner/dataset (or owner/dataset/versions/N)"),
              Param("subdir", "string", "", "Folder inside the dataset that holds the class folders"),
              Param("cache_dir", "string", "", "kagglehub cache folder under the data folder (empty: the default)"))

    @classmethod
    def preflight(cls, params: dict[str, Any], layout: Layout) -> list[tuple[str, str]]:
        problems = super().preflight(params, layout)
        if problems:
            return problems
        try:
            _root, message = kaggle_root(layout, params)
        except CduiError as exc:
            return [("bad_param", exc.message)]
        except ValueError as exc:
            return [("bad_param", str(exc))]
        return [("missing_dataset", message)] if message else []

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        from cdui.nodes.builtin._torchlib.images import ImageFolder

        root, message = kaggle_root(ctx.layout, params)
        if message:
            raise ValueError(message)
        dataset = ImageFolder(root)
        ctx.log(f"KaggleDataset: {len(dataset)} images in {len(dataset.classes)} classes from {root}")
        return {"dataset": dataset}
