"""Nodes that read and write files: models, checkpoints, images, text.

Path rules (the file semantics later parts of cdui derive from these param
types, see :mod:`cdui.nodes.base`):

- ModelSaver / CheckpointSaver write ``output_path`` values relative to
  ``models/``, ImageWriter relative to ``output/`` (CodefyUI's folders);
- ModelLoader / CheckpointLoader read ``model_file`` uploads (``models/``),
  ImageReader ``image_file`` uploads (``images/``);
- FileReader reads a plain ``path``: bare names from ``data/graphs`` as
  CodefyUI does, anything else relative to the installation.

Every resolution goes through the RunContext, so ``..`` and absolute paths are
refused with PathRefused. Every file written is recorded with ``ctx.artifact``.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdui.nodes.base import ANY, IMAGE, MODEL, OPTIMIZER, SCALAR, STRING, TENSOR, Node, Param, Port
from cdui.nodes.builtin._util import DEVICE_OPTIONS, as_bool, resolve_device
from cdui.nodes.builtin.training_loop import checkpoint_payload, write_checkpoint

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from cdui.graph.context import RunContext


def _require_file(path: Path, what: str, value: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {value!r} (looked at {path})")
    return path


def _full_model_globals() -> list[Callable[..., Any]]:
    """Classes a full-model file may name: torch.nn's layers and cdui's own."""
    import torch.nn as nn

    from cdui.nodes.builtin._torchlib import layer_spec

    out: list[Callable[..., Any]] = [v for v in vars(nn).values() if isinstance(v, type) and issubclass(v, nn.Module)]
    out += [v for v in vars(layer_spec).values()
            if isinstance(v, type) and issubclass(v, nn.Module) and v.__module__ == layer_spec.__name__]
    return out


class ModelSaverNode(Node):
    NODE_NAME = "ModelSaver"
    CATEGORY = "IO"
    DESCRIPTION = "Save model weights (state_dict) to a .pt/.pth/.safetensors file"
    WRITES_TO = "models"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("model", MODEL, "Trained model to save")]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("path", STRING, "Path to the saved file"),
            Port("model", MODEL, "Pass-through model (for chaining)"),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("path", "output_path", "model_weights.pt",
                  "Output file, relative to the models folder (.pt, .pth, or .safetensors)"),
            Param("save_mode", "select", "state_dict", "Save mode: state_dict (recommended) or full model",
                  options=["state_dict", "full_model"]),
            Param("format", "select", "pytorch",
                  "File format: pytorch (.pt/.pth) or safetensors (.safetensors)",
                  options=["pytorch", "safetensors"]),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch

        model = inputs.get("model")
        if model is None:
            raise ValueError("ModelSaver requires a `model` input")
        value = str(params.get("path") or "model_weights.pt").strip()
        mode = str(params.get("save_mode") or "state_dict")
        fmt = str(params.get("format") or "pytorch")
        path = ctx.output_path(self.WRITES_TO or "models", value)
        if fmt == "safetensors":
            if mode == "full_model":
                raise ValueError("ModelSaver: safetensors stores tensors only; use save_mode=state_dict")
            if path.suffix != ".safetensors":
                path = ctx.output_path(self.WRITES_TO or "models",
                                       str(Path(value).with_suffix(".safetensors")))
            from cdui.nodes.builtin._torchlib.safetensors_io import save_file

            save_file(model.state_dict(), path)
        elif mode == "state_dict":
            torch.save(model.state_dict(), str(path))
        else:
            try:
                torch.save(model, str(path))
            except (AttributeError, TypeError) as exc:  # pickle cannot name the class
                path.unlink(missing_ok=True)
                raise ValueError(f"ModelSaver: full_model could not pickle this model ({exc}); "
                                 f"use save_mode=state_dict") from None
        params_count = sum(p.numel() for p in model.parameters())
        ctx.artifact("model", path, value)
        ctx.log(f"Saved {mode} ({params_count:,} parameters) to {path.name}")
        return {"path": str(path), "model": model}


def load_weights(model: Any, state: Any, ctx: RunContext, where: str, strict: bool = True) -> None:
    """Load ``state`` into ``model``: weights saved by CodefyUI or cdui (key
    layout ``layers.<id>.<param>``), and with a warning those saved by cdui 0.1
    (top-level keys). A mismatch is one sentence naming the keys, not
    PyTorch's raw key error."""
    from cdui.nodes.builtin._torchlib.layer_spec import adapt_state_dict, describe_mismatch

    if not isinstance(state, dict):
        raise ValueError(f"{where} holds {type(state).__name__}, not a state_dict of weights")
    state, renamed = adapt_state_dict(model, state)
    if renamed:
        ctx.warning("legacy_weights", f"{where}: weights saved by cdui 0.1 (keys without the "
                    f"'layers.' prefix); loaded by renaming them. Save them again to get the "
                    f"layout CodefyUI and this cdui share.")
    problem = describe_mismatch(model, state) if strict else None
    if problem is not None:
        raise ValueError(f"{where} does not fit the connected model: {problem}. Connect the "
                         f"model the weights were trained with (same layers and sizes), or set "
                         f"strict=false to load the weights that match")
    model.load_state_dict(state, strict=strict)


class ModelLoaderNode(Node):
    NODE_NAME = "ModelLoader"
    CACHEABLE = False  # a live object training changes in place
    CATEGORY = "IO"
    DESCRIPTION = "Load model weights from a .pt/.pth file into a model, or load a full saved model"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("model", MODEL, "Model architecture to load weights into (required for "
                     "state_dict mode)", optional=True)]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("model", MODEL, "Model with loaded weights")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("path", "model_file", "", "Weights file (.pt, .pth, .safetensors) in the models folder"),
            Param("load_mode", "select", "state_dict",
                  "Load mode: state_dict (requires model input) or full_model",
                  options=["state_dict", "full_model"]),
            Param("device", "select", "auto", "Device to load weights onto ('auto' follows the run's device)",
                  options=list(DEVICE_OPTIONS)),
            Param("strict", "bool", True, "Whether the state_dict keys must match exactly (state_dict mode)"),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch

        value = str(params.get("path") or "").strip()
        if not value:
            raise ValueError("ModelLoader needs a `path`: a weights file in the models folder")
        path = _require_file(ctx.resolve_upload("models", value), "Weights file", value)
        device = resolve_device(params.get("device"), ctx)
        mode = str(params.get("load_mode") or "state_dict")
        is_st = path.suffix == ".safetensors"
        if mode == "state_dict":
            model = inputs.get("model")
            if model is None:
                raise ValueError("ModelLoader: state_dict mode requires a model input; connect a "
                                 "SequentialModel (same architecture) or use full_model mode")
            if is_st:
                from cdui.nodes.builtin._torchlib.safetensors_io import load_file

                state: Any = load_file(path, device="cpu")
            else:
                state = torch.load(str(path), map_location="cpu", weights_only=True)
            if isinstance(state, dict) and "model_state_dict" in state:
                state = state["model_state_dict"]  # a training checkpoint works too
            load_weights(model, state, ctx, f"ModelLoader: {path.name}",
                         strict=as_bool(params.get("strict"), True))
            model = model.to(device)
        else:
            if is_st:
                raise ValueError("ModelLoader: safetensors holds weights only; use load_mode=state_dict")
            # Restricted unpickling: only torch.nn layers and cdui's own layer
            # classes may be constructed from the file. (A copy of the list: safe_globals takes a list of a wider type.)
            with torch.serialization.safe_globals(list(_full_model_globals())):
                try:
                    model = torch.load(str(path), map_location="cpu", weights_only=True)
                except Exception as exc:
                    raise ValueError(f"ModelLoader: {path.name} cannot be loaded as a full model "
                                     f"({type(exc).__name__}); re-save it with save_mode=state_dict "
                                     f"and load it into a matching model") from None
            model = model.to(device)
        ctx.log(f"Loaded {mode} from {path.name}")
        return {"model": model}


class CheckpointSaverNode(Node):
    NODE_NAME = "CheckpointSaver"
    CATEGORY = "IO"
    DESCRIPTION = ("Save a full training checkpoint (model + optimizer + epoch + loss) for "
                   "resuming training later")
    WRITES_TO = "models"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [
            Port("model", MODEL, "Trained model"),
            Port("optimizer", OPTIMIZER, "Optimizer state"),
            Port("losses", TENSOR, "Loss history", optional=True),
        ]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("path", STRING, "Path to the saved checkpoint"),
            Port("model", MODEL, "Pass-through model"),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("path", "output_path", "checkpoint.pt", "Checkpoint file, relative to the models folder"),
            Param("epoch", "int", 0, "Current epoch number to store in checkpoint"),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:

        model, optimizer = inputs.get("model"), inputs.get("optimizer")
        if model is None or optimizer is None:
            raise ValueError("CheckpointSaver requires `model` and `optimizer` inputs")
        value = str(params.get("path") or "checkpoint.pt").strip()
        epoch = int(params.get("epoch") or 0)
        losses = inputs.get("losses")
        payload = checkpoint_payload(model, optimizer, epoch, [])
        if losses is not None:
            payload["losses"] = losses
        else:
            del payload["losses"]
        path = write_checkpoint(payload, ctx.output_path(self.WRITES_TO or "models", value))
        ctx.artifact("checkpoint", path, value)
        ctx.log(f"Saved checkpoint (epoch={epoch}) to {path.name}")
        return {"path": str(path), "model": model}


class CheckpointLoaderNode(Node):
    NODE_NAME = "CheckpointLoader"
    CACHEABLE = False  # a live object training changes in place
    CATEGORY = "IO"
    DESCRIPTION = "Load a training checkpoint to resume training (restores model + optimizer + epoch)"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [
            Port("model", MODEL, "Model architecture to load weights into"),
            Port("optimizer", OPTIMIZER, "Optimizer to restore state into"),
        ]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("model", MODEL, "Model with restored weights"),
            Port("optimizer", OPTIMIZER, "Optimizer with restored state"),
            Port("epoch", SCALAR, "Epoch number from checkpoint (complete epochs)"),
            Port("losses", TENSOR, "Loss history from checkpoint"),
            Port("grad_scaler_state", ANY, "fp16 loss-scale state (None if the checkpoint has none)"),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("path", "model_file", "", "Checkpoint file in the models folder"),
            Param("device", "select", "auto", "Device to load onto ('auto' follows the run's device)",
                  options=list(DEVICE_OPTIONS)),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch

        model, optimizer = inputs.get("model"), inputs.get("optimizer")
        if model is None or optimizer is None:
            raise ValueError("CheckpointLoader requires `model` and `optimizer` inputs")
        value = str(params.get("path") or "").strip()
        if not value:
            raise ValueError("CheckpointLoader needs a `path`: a checkpoint file in the models folder")
        path = _require_file(ctx.resolve_upload("models", value), "Checkpoint file", value)
        device = resolve_device(params.get("device"), ctx)
        ckpt = torch.load(str(path), map_location="cpu", weights_only=True)
        if not isinstance(ckpt, dict) or "model_state_dict" not in ckpt:
            raise ValueError(f"CheckpointLoader: {path.name} is not a training checkpoint (no "
                             f"model_state_dict); load plain weights with ModelLoader")
        load_weights(model, ckpt["model_state_dict"], ctx, f"CheckpointLoader: {path.name}")
        model = model.to(device)
        # Re-point the optimizer at the (possibly moved) parameters, then let
        # load_state_dict cast its state onto their device.
        params_list = list(model.parameters())
        offset = 0
        for group in optimizer.param_groups:
            n = len(group["params"])
            group["params"] = params_list[offset:offset + n]
            offset += n
        if "optimizer_state_dict" in ckpt:
            optimizer.load_state_dict(ckpt["optimizer_state_dict"])
        for group, lr0 in zip(optimizer.param_groups, ckpt.get("initial_lrs") or [], strict=False):
            group["initial_lr"] = lr0
        epoch = ckpt.get("epoch", 0)
        losses = ckpt.get("losses", torch.tensor([]))
        ctx.log(f"Loaded checkpoint {path.name} (epoch={epoch})")
        return {"model": model, "optimizer": optimizer, "epoch": epoch, "losses": losses,
                "grad_scaler_state": ckpt.get("scaler_state_dict")}


class ImageReaderNode(Node):
    NODE_NAME = "ImageReader"
    CATEGORY = "IO"
    DESCRIPTION = "Read an image file and output it as a tensor (C, H, W) with values in [0, 1]"

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("image", IMAGE, "Image as tensor (C, H, W)"),
            Port("tensor", TENSOR, "Same image as generic tensor"),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("path", "image_file", "", "Image file: an uploaded image (images folder)"),
            Param("mode", "select", "RGB", "Color mode for the loaded image", options=["RGB", "L", "RGBA"]),
            Param("resize", "int", 0, "Resize image to a (resize, resize) square (0 = no resize)",
                  min_value=0),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        from cdui.nodes.builtin._torchlib.images import load_tensor

        value = str(params.get("path") or "").strip()
        if not value:
            raise ValueError("ImageReader needs a `path`: an uploaded image")
        path = _require_file(ctx.resolve_upload("images", value), "Image", value)
        tensor = load_tensor(path, str(params.get("mode") or "RGB"), int(params.get("resize") or 0))
        return {"image": tensor, "tensor": tensor}


class ImageWriterNode(Node):
    NODE_NAME = "ImageWriter"
    CATEGORY = "IO"
    DESCRIPTION = "Save a tensor as an image file (PNG, JPEG, etc.)"
    WRITES_TO = "output"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("image", IMAGE, "Image tensor (C, H, W) or (H, W), values in [0, 1]")]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("path", STRING, "Path to the saved image")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("path", "output_path", "output.png", "Output file, relative to the output folder"),
            Param("format", "select", "PNG", "Image format (JPEG and TIFF need Pillow)",
                  options=["PNG", "JPEG", "BMP", "TIFF"]),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch

        from cdui.nodes.builtin._torchlib.images import save_tensor

        image = inputs.get("image")
        if not isinstance(image, torch.Tensor):
            raise ValueError("ImageWriter requires an `image` tensor input")
        fmt = str(params.get("format") or "PNG").upper()
        ext = {"PNG": ".png", "JPEG": ".jpg", "BMP": ".bmp", "TIFF": ".tiff"}.get(fmt, ".png")
        value = str(params.get("path") or "output.png").strip()
        if Path(value).suffix.lower() != ext:
            value = str(Path(value).with_suffix(ext))
        path = ctx.output_path(self.WRITES_TO or "output", value)
        save_tensor(image, path, fmt)
        ctx.artifact("output", path, value)
        return {"path": str(path)}


class FileReaderNode(Node):
    NODE_NAME = "FileReader"
    CATEGORY = "IO"
    DESCRIPTION = ("Read a text or CSV file and output its contents as a string or as a "
                   "tensor (for numeric CSV)")

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("text", STRING, "Raw file contents as string"),
            Port("tensor", TENSOR, "Numeric data as tensor (for CSV files)"),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("path", "path", "", "Path to the file (bare names are read from data/graphs)"),
            Param("mode", "select", "text", "How to read the file", options=["text", "csv"]),
            Param("encoding", "string", "utf-8", "Text encoding"),
            Param("csv_header", "bool", True, "Whether the CSV has a header row (skipped for the tensor)"),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:

        import torch

        value = str(params.get("path") or "").strip()
        if not value:
            raise ValueError("FileReader needs a `path`")
        v = value.replace("\\", "/")
        path = ctx.resolve(v)
        if not v.startswith("data/") and "/" not in v:
            graphs = ctx.resolve("data/graphs/" + v)
            path = graphs if graphs.is_file() or not path.is_file() else path
        _require_file(path, "File", value)
        text = path.read_text(encoding=str(params.get("encoding") or "utf-8"))
        tensor = torch.tensor([])
        if str(params.get("mode") or "text") == "csv":
            rows = [r for r in csv.reader(io.StringIO(text)) if r]
            if as_bool(params.get("csv_header"), True) and rows:
                rows = rows[1:]
            try:
                tensor = torch.tensor([[float(c) for c in r] for r in rows], dtype=torch.float32)
            except (ValueError, TypeError):
                ctx.warning("non_numeric_csv", f"{path.name} has non-numeric cells; the tensor output is empty")
        return {"text": text, "tensor": tensor}
