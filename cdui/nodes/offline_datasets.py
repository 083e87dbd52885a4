"""The image datasets CodefyUI's ``Dataset`` node names, read from disk only.

cdui never downloads (air-gapped labs): a dataset is a set of files in
torchvision's own on-disk layouts, under a machine's data folder:

- MNIST: ``MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``
- FashionMNIST: ``FashionMNIST/raw/`` with the same names
- CIFAR10: ``cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}``

so a folder torchvision (or CodefyUI) already filled works as it is. The
formats are read here directly (the IDX header and the CIFAR batches), because
torchvision cannot be installed beside every torch build a lab pins; items are
what torchvision with CodefyUI's transform gives: a float (C, H, W) tensor
scaled to [-1, 1] (``ToTensor`` then ``Normalize(0.5, 0.5)``) and an int label.

:func:`import_archive` puts downloaded archives in place after checking them
against the published MD5 sums (the same ones torchvision checks), so a file
carried in on a USB stick is known to be the real dataset.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import struct
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAMES = ("MNIST", "CIFAR10", "FashionMNIST")
# The layout folder a worker's per-run layout (transfer, s3) names the machine's own data
# folder by: datasets stay where they were imported, they are not sent with each run.
DATASETS_FOLDER = "datasets"
# Largest archive member or decompressed file accepted (the real ones are < 200 MB).
MAX_FILE_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Spec:
    folder: str  # relative to the data folder
    splits: dict[str, tuple[str, ...]]  # split -> files it needs, relative to folder
    archives: dict[str, str]  # archive file name -> published MD5
    source: str  # where to download the archives (for the message)


_IDX: dict[str, tuple[str, ...]] = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
SPECS: dict[str, Spec] = {
    "MNIST": Spec("MNIST/raw", _IDX, {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"},
        "https://ossci-datasets.s3.amazonaws.com/mnist/"),
    "FashionMNIST": Spec("FashionMNIST/raw", _IDX, {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"},
        "https://github.com/zalandoresearch/fashion-mnist (data/fashion/)"),
    "CIFAR10": Spec("cifar-10-batches-py", {
        "train": tuple(f"data_batch_{i}" for i in range(1, 6)) + ("batches.meta",),
        "test": ("test_batch", "batches.meta")},
        {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"},
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
}


class DatasetMissing(ValueError):
    """The files a dataset needs are not all on this machine."""


def spec(name: str) -> Spec:
    if name not in SPECS:
        raise ValueError(f"unknown dataset {name!r}; cdui reads {', '.join(NAMES)}")
    return SPECS[name]


def missing_files(root: Path, name: str, split: str) -> list[Path]:
    s = spec(name)
    return [root / s.folder / f for f in s.splits[split] if not (root / s.folder / f).is_file()]


def missing_message(root: Path, name: str, split: str) -> str | None:
    """What is missing and how to put it there, or None when all is in place."""
    missing = missing_files(root, name, split)
    if not missing:
        return None
    s = spec(name)
    archives = " ".join(sorted(s.archives))
    return (f"dataset {name} ({split}) is not on this machine: {len(missing)} file(s) missing in "
            f"{root / s.folder} ({', '.join(p.name for p in missing)}). cdui never downloads: fetch "
            f"{archives} from {s.source} on a connected machine, carry them over, and run "
            f"`cdui datasets import {name} {archives}` on this one")


# -- reading --------------------------------------------------------------------------------
def _read_idx(path: Path, dims: int) -> Any:
    import torch

    raw = path.read_bytes()
    if len(raw) < 4 + 4 * dims:
        raise ValueError(f"{path} is too short to be an IDX file")
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08 or ndim != dims:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes with {dims} dimension(s) "
                         f"(header {raw[:4].hex()}); import the dataset again")
    shape = struct.unpack(f">{dims}I", raw[4:4 + 4 * dims])
    count = 1
    for d in shape:
        count *= d
    body = raw[4 + 4 * dims:]
    if len(body) != count:
        raise ValueError(f"{path} holds {len(body)} bytes of data but its header says {count}; "
                         f"the file is truncated: import the dataset again")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(shape)


class _Unpickler(pickle.Unpickler):
    """Unpickles CIFAR's batches (a dict of bytes, lists and numpy arrays) and nothing else."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"CIFAR batch refers to {module}.{name}, which a dataset file "
                                     f"never needs; the file is not the published dataset")


def _read_cifar_batch(path: Path) -> tuple[Any, list[int]]:
    import torch

    try:
        import numpy  # noqa: F401 - the batches hold numpy arrays
    except ImportError:
        raise ValueError("reading CIFAR10 needs numpy (the batches are numpy arrays): install the "
                         "vision extra (bin/cdui start --extras vision) or pip install numpy") from None
    with path.open("rb") as f:
        batch = _Unpickler(f, encoding="latin1").load()
    data = torch.as_tensor(batch["data"]).reshape(-1, 3, 32, 32)
    return data, [int(v) for v in batch["labels"]]


class OfflineImageDataset:
    """A map-style dataset of (image, label): images uint8 in memory, scaled
    per item as torchvision's ``ToTensor`` + ``Normalize(0.5, 0.5)`` do.

    ``transform`` (None) may be replaced by a callable on the float image, as
    CodefyUI's Transform node replaces a torchvision dataset's transform."""

    def __init__(self, images: Any, labels: Any, classes: list[str], name: str, split: str) -> None:
        self.images, self.labels, self.classes = images, labels, classes
        self.name, self.split = name, split
        self.transform: Any = None

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import torch

        img = self.images[index]
        if img.dim() == 2:
            img = img.unsqueeze(0)
        if getattr(self.transform, "takes_raw", False):
            # Transform's pipeline replaces ToTensor + Normalize, as it replaces
            # a torchvision dataset's transform: it gets the 8-bit image
            return self.transform(img), int(self.labels[index])
        x = img.to(torch.float32).div(255).sub(0.5).div(0.5)
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.labels[index])

    def __repr__(self) -> str:
        return f"{self.name} ({self.split}, {len(self)} images)"


MNIST_CLASSES = [str(i) for i in range(10)]
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                   "Bag", "Ankle boot"]


def load(root: Path, name: str, split: str) -> OfflineImageDataset:
    """The dataset ``name``/``split`` from the data folder ``root``; raises
    :class:`DatasetMissing` saying what to do when files are missing."""
    import torch

    problem = missing_message(root, name, split)
    if problem:
        raise DatasetMissing(problem)
    s = spec(name)
    folder = root / s.folder
    if name in ("MNIST", "FashionMNIST"):
        images_name, labels_name = s.splits[split]
        images, labels = _read_idx(folder / images_name, 3), _read_idx(folder / labels_name, 1)
        if images.shape[0] != labels.shape[0]:
            raise ValueError(f"{name} {split}: {images.shape[0]} images but {labels.shape[0]} labels; "
                             f"import the dataset again")
        classes = MNIST_CLASSES if name == "MNIST" else FASHION_CLASSES
        return OfflineImageDataset(images, labels.to(torch.long), classes, name, split)
    parts = [_read_cifar_batch(folder / f) for f in s.splits[split] if f != "batches.meta"]
    with (folder / "batches.meta").open("rb") as f:
        meta = _Unpickler(f, encoding="latin1").load()
    images = torch.cat([p[0] for p in parts])
    labels = torch.tensor([v for p in parts for v in p[1]], dtype=torch.long)
    return OfflineImageDataset(images, labels, [str(c) for c in meta.get("label_names", [])], name, split)


# -- importing archives ----------------------------------------------------------------------
def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _copy_bounded(src: io.BufferedIOBase | Any, dest: Path) -> None:
    """Copy a stream into ``dest`` (through a temp file, renamed at the end),
    refusing more than MAX_FILE_BYTES."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, prefix=".import-", delete=False) as tmp:
        try:
            total = 0
            for chunk in iter(lambda: src.read(1 << 20), b""):
                total += len(chunk)
                if total > MAX_FILE_BYTES:
                    raise ValueError(f"{dest.name} unpacks to more than {MAX_FILE_BYTES >> 20} MiB; "
                                     f"that is not the published dataset")
                tmp.write(chunk)
        except BaseException:
            Path(tmp.name).unlink(missing_ok=True)
            raise
    Path(tmp.name).replace(dest)


def import_archive(name: str, archive: Path, root: Path, specs: dict[str, Spec] | None = None) -> list[Path]:
    """Check ``archive`` against the published MD5 of dataset ``name`` and put
    its files in place under the data folder ``root``. Returns the files written.

    ``specs`` (default :data:`SPECS`) is the table of datasets; tests pass one
    describing archives they make, since the real ones cannot be fetched offline."""
    s = (specs or SPECS).get(name) or spec(name)
    if not archive.is_file():
        raise ValueError(f"{archive} is not a file")
    expected = s.archives.get(archive.name)
    if expected is None:
        raise ValueError(f"{archive.name} is not one of {name}'s archives ({', '.join(sorted(s.archives))}); "
                         f"keep the file name it was published with")
    actual = _md5(archive)
    if actual != expected:
        raise ValueError(f"{archive} has MD5 {actual} but the published {archive.name} has {expected}; "
                         f"the download is incomplete or not the real file: fetch it again")
    folder = root / s.folder
    written: list[Path] = []
    if archive.name.endswith(".gz") and not archive.name.endswith(".tar.gz"):
        dest = folder / archive.name.removesuffix(".gz")
        with gzip.open(archive, "rb") as gz:
            _copy_bounded(gz, dest)
        written.append(dest)
        return written
    wanted = {f for files in s.splits.values() for f in files}
    top = s.folder.split("/")[-1]
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            # Only the dataset's own regular files, by their known names: nothing
            # else in an archive (links, absolute or '..' paths) is ever written.
            if member.isfile() and len(parts) == 2 and parts[0] == top and parts[1] in wanted:
                src = tar.extractfile(member)
                if src is not None:
                    _copy_bounded(src, folder / parts[1])
                    written.append(folder / parts[1])
    missing = sorted(wanted - {p.name for p in written})
    if missing:
        raise ValueError(f"{archive.name} lacks {', '.join(missing)}; fetch it again")
    return written
