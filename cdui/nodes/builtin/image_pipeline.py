"""Images into tensors without torchvision: Transform and ImageBatchReader.

torchvision cannot be installed beside the torch cdui pins (the only
torchvision wheel for torch 2.13 is built for CUDA and does not load beside
the CPU torch), so the steps CodefyUI takes from it are done here:

- **Transform** installs a :class:`Pipeline` as the dataset's ``transform``,
  replacing the one it had, in place, as CodefyUI does (every consumer of that
  dataset sees it). The steps are CodefyUI's, in its order: ``Resize((r, r))``
  when ``resize > 0``, ``ToTensor`` (8-bit values to floats in [0, 1]),
  ``Normalize((0.5,), (0.5,))``. Datasets that hold 8-bit images (``Dataset``,
  ``ImageFolderDataset``, ``KaggleDataset``, ``HuggingFaceDataset``) hand the
  pipeline the 8-bit image, as torchvision hands it the PIL image; datasets of
  tensors hand it their float tensor (``ToTensor`` then changes nothing).
  The resize is torch's antialiased bilinear resize, which agrees with PIL's
  (what torchvision uses on a PIL image) to within one 8-bit level.
- **ImageBatchReader** reads with Pillow (the ``vision`` extra) and resizes with
  Pillow's bilinear filter, exactly what torchvision's ``Resize`` does to a PIL
  image, so its batches are CodefyUI's bit for bit.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cdui.core.errors import CduiError
from cdui.core.paths import safe_join
from cdui.nodes.base import DATASET, SCALAR, Param, Port
from cdui.nodes.builtin._declared import B, DeclaredNode, I, T, int_param
from cdui.nodes.builtin._util import as_bool

if TYPE_CHECKING:  # pragma: no cover
    from cdui.core.layout import Layout
    from cdui.graph.context import RunContext

# Bounds checked before any pixel is decoded: a folder or a file may be huge.
MAX_FILES = 10_000
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_IMAGE_PIXELS = 40_000_000
MAX_BATCH_VALUES = 256 * 1024 * 1024
MAX_RESIZE = 4096


class Pipeline:
    """Resize / ToTensor / Normalize(0.5, 0.5), each optional, in that order.

    ``takes_raw`` tells a dataset that holds 8-bit images to hand them over as
    they are (uint8 (C, H, W)), the way torchvision hands a PIL image over."""

    takes_raw = True

    def __init__(self, resize: int, to_tensor: bool, normalize: bool) -> None:
        self.resize, self.to_tensor, self.normalize = resize, to_tensor, normalize

    def __call__(self, image: Any) -> Any:
        import torch
        import torch.nn.functional as F

        resized = False
        if is_pil_image(image):
            # A dataset of PIL images (as torchvision's hand over): resized by Pillow, exactly as
            # torchvision's Resize does it, then taken as its 8-bit (C, H, W) tensor.
            if self.resize > 0:
                from PIL import Image

                image = image.resize((self.resize, self.resize), Image.Resampling.BILINEAR)
                resized = True
            x = pil_to_tensor(image)
        else:
            x = image if isinstance(image, torch.Tensor) else torch.as_tensor(image)
        raw = x.dtype == torch.uint8
        if self.resize > 0 and not resized:
            squeeze = x.dim() == 2
            batch = (x[None, None] if squeeze else x[None]).float()
            out = F.interpolate(batch, size=(self.resize, self.resize), mode="bilinear",
                                align_corners=False, antialias=True)[0]
            if raw:
                out = out.round().clamp(0, 255).to(torch.uint8)
            x = out[0] if squeeze else out
        if self.to_tensor and x.dtype == torch.uint8:
            x = x.to(torch.float32).div(255)
        if self.normalize:
            if x.dtype == torch.uint8:
                raise ValueError("Transform: normalize needs to_tensor (8-bit images cannot be normalized, "
                                 "as in torchvision)")
            x = (x - 0.5) / 0.5
        return x

    def __repr__(self) -> str:
        steps = ([f"Resize({self.resize})"] if self.resize > 0 else []) + (["ToTensor"] if self.to_tensor else [])
        return "Pipeline(" + ", ".join(steps + (["Normalize(0.5, 0.5)"] if self.normalize else [])) + ")"


def is_pil_image(value: Any) -> bool:
    """Whether ``value`` is a Pillow image (checked without importing Pillow)."""
    return any(c.__module__ == "PIL.Image" and c.__name__ == "Image" for c in type(value).__mro__)


# Pillow modes whose pixels are not 8-bit bands, and the dtype torchvision gives them.
_WIDE_MODES = {"I": "int32", "F": "float32"}


def pil_to_tensor(image: Any) -> Any:
    """A Pillow image as torchvision's ``pil_to_tensor`` gives it: (C, H, W), uint8 for 8-bit
    modes (``1`` as 0/255, ``P`` as palette indices), int32 for ``I`` (and ``I;16``), float32 for ``F``."""
    import torch

    if image.mode == "1":
        image = image.convert("L")
    elif image.mode.startswith("I;16"):
        image = image.convert("I")
    w, h = image.size
    bands = len(image.getbands())
    wide = _WIDE_MODES.get(image.mode)
    if wide is not None:
        dtype = getattr(torch, wide)
        flat = torch.frombuffer(bytearray(image.tobytes("raw", image.mode)), dtype=dtype)
    else:
        flat = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    return flat.reshape(h, w, bands).permute(2, 0, 1).contiguous()


class TransformNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Transform", "Data"
    DESCRIPTION = "Set a dataset's image pipeline (Resize, ToTensor, Normalize(0.5, 0.5)) in place"
    INPUTS = (Port("dataset", DATASET, "Dataset to apply transforms to"),)
    OUTPUTS = (Port("dataset", DATASET, "The same dataset, with its new transform"),)
    PARAMS = (I("resize", 0, "Resize to a (resize, resize) square (0: no resize)", lo=0),
              B("normalize", True, "Normalize with mean 0.5 and std 0.5 (to [-1, 1])"),
              B("to_tensor", True, "Convert 8-bit images to float tensors in [0, 1]"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        dataset = inputs.get("dataset")
        if dataset is None:
            raise ValueError("Transform requires a `dataset` input")
        resize = int_param(params, "resize", 0)
        if resize > MAX_RESIZE:
            raise ValueError(f"Transform: resize={resize} is larger than {MAX_RESIZE}")
        to_tensor, normalize = as_bool(params.get("to_tensor"), True), as_bool(params.get("normalize"), True)
        if resize > 0 or to_tensor or normalize:  # all three off: the transform is left as it was
            try:
                dataset.transform = Pipeline(resize, to_tensor, normalize)
            except AttributeError:
                raise ValueError(f"Transform: the dataset ({type(dataset).__name__}) has no transform "
                                 f"to replace") from None
        return {"dataset": dataset}


def image_directory(layout: Layout, value: Any) -> Path:
    """The folder ``directory`` names: relative to the data folder, as CodefyUI's
    ``backend/data``; ``data/...`` means the same folder."""

    v = str(value or "").strip().replace("\\", "/").removeprefix("./")
    if not v:
        raise ValueError("ImageBatchReader: Directory is required: set the `directory` param to a folder under "
                         "the data folder")
    if v.startswith("/"):
        return layout.resolve(v)  # an absolute folder: read only under CODEFYUI_READ_ROOTS
    rel = v[5:] if v.startswith("data/") else ("" if v == "data" else v)
    return layout.check_not_private(safe_join(layout.data_dir, rel, allow_empty=True), v)


def selected_files(folder: Path, pattern: str, max_images: int) -> list[Path]:
    """The regular files in ``folder`` whose name matches ``pattern``, sorted, at most ``max_images``
    (0: all, up to :data:`MAX_FILES`); nothing outside the folder, however a name links."""

    if not pattern or "/" in pattern or "\\" in pattern or ".." in pattern or "\x00" in pattern:
        raise ValueError(f"ImageBatchReader: pattern must be a file-name pattern such as *.png, "
                         f"without '/' or '..', got {pattern!r}")
    names = sorted(p.name for p in folder.glob(pattern))
    limit = max_images if max_images > 0 else MAX_FILES
    if max_images <= 0 and len(names) > MAX_FILES:
        raise ValueError(f"ImageBatchReader: {len(names)} files match {pattern!r} in {folder}, more than "
                         f"{MAX_FILES}; set max_images")
    out = []
    for name in names[:limit]:
        path = folder / name
        if path.is_symlink():  # a link may lead anywhere: only the folder's own files are read
            continue
        path = safe_join(folder, name)
        if path.is_file():
            out.append(path)
    return out


class ImageBatchReaderNode(DeclaredNode):
    NODE_NAME, CATEGORY = "ImageBatchReader", "IO"
    DESCRIPTION = "Read the images of a folder, resize them to a square and stack them into (N, C, H, W)"
    NEEDS: ClassVar[tuple[str, ...]] = ("PIL",)
    EXTRA: ClassVar[str | None] = "vision"
    OUTPUTS = (T("images", "Batch of images (N, C, H, W) in [0, 1]"),
               Port("count", SCALAR, "Number of images loaded"))
    PARAMS = (Param("directory", "folder", "", "Folder of images, relative to the data folder"),
              Param("pattern", "string", "*.png", "File-name pattern (e.g. *.png, *.jpg)"),
              I("resize", 224, "Resize every image to this square size (needed to stack them)", lo=1),
              I("max_images", 0, "Most images to load (0 = all)", lo=0),
              Param("mode", "select", "RGB", "Colour mode", options=["RGB", "L", "RGBA"]))

    @classmethod
    def preflight(cls, params: dict[str, Any], layout: Layout) -> list[tuple[str, str]]:
        problems = super().preflight(params, layout)
        if problems or not str(params.get("directory") or "").strip():
            return problems
        try:
            folder = image_directory(layout, params.get("directory"))
        except CduiError as exc:
            return [("bad_param", f"directory: {exc.message}")]
        if not folder.is_dir():
            return [("missing_files", f"directory {params.get('directory')!r} is not a folder on this machine "
                     f"(looked at {folder}); put the images in that folder under the data folder")]
        return []

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch
        from PIL import Image

        folder = image_directory(ctx.layout, params.get("directory"))
        if not folder.is_dir():
            raise FileNotFoundError(f"ImageBatchReader: directory not found: {params.get('directory')!r} "
                                    f"({folder}); put the images in that folder under the data folder")
        pattern = str(params.get("pattern") or "*.png")
        size, mode = int_param(params, "resize", 224), str(params.get("mode") or "RGB")
        if mode not in ("RGB", "L", "RGBA"):
            raise ValueError(f"ImageBatchReader: mode must be RGB, L or RGBA, got {mode!r}")
        if not 1 <= size <= MAX_RESIZE:
            raise ValueError(f"ImageBatchReader: resize must be between 1 and {MAX_RESIZE}, got {size}")
        paths = selected_files(folder, pattern, int_param(params, "max_images", 0))
        if not paths:
            raise ValueError(f"ImageBatchReader: No images match {pattern!r} in {params.get('directory')!r}")
        channels = len(mode)
        if len(paths) * channels * size * size > MAX_BATCH_VALUES:
            raise ValueError(f"ImageBatchReader: {len(paths)} images of {size}x{size} would be more than "
                             f"{MAX_BATCH_VALUES:,} values; set max_images or a smaller resize")
        tensors = []
        for path in paths:
            try:
                if path.stat().st_size > MAX_FILE_BYTES:
                    raise ValueError(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
                with Image.open(path) as img:
                    if img.width * img.height > MAX_IMAGE_PIXELS:
                        raise ValueError(f"{img.width}x{img.height} pixels, more than {MAX_IMAGE_PIXELS:,}")
                    picture = img.convert(mode).resize((size, size), Image.Resampling.BILINEAR)
            except (OSError, ValueError, Image.DecompressionBombError) as exc:
                # as in CodefyUI, one unreadable file is skipped, not the whole batch
                ctx.warning("image_skipped", f"ImageBatchReader: skipped {path.name}: {exc}", file=path.name)
                continue
            t = torch.frombuffer(bytearray(picture.tobytes()), dtype=torch.uint8).reshape(size, size, channels)
            tensors.append(t.permute(2, 0, 1).to(torch.float32).div(255))
        if not tensors:
            raise ValueError("ImageBatchReader: none of the matching images could be read")
        batch = torch.stack(tensors)
        ctx.log(f"ImageBatchReader: {len(tensors)} images, batch {tuple(batch.shape)}")
        return {"images": batch, "count": len(tensors)}
