"""VideoWrite and VideoLoad: frames tensors to clips and back, as CodefyUI's.

Frames travel as CodefyUI's do: in, ``(T, C, H, W)`` or ``(T, H, W, C)``,
float in [0, 1] or uint8, grey or RGB; out, ``(T, 3, H, W)`` float in [0, 1].
GIF goes through Pillow (the ``vision`` or ``video`` extra); MP4 and WebM go
through PyAV (the ``video`` extra), the FFmpeg bindings whose wheels carry
their own codecs, where CodefyUI runs an ``ffmpeg`` binary from PATH. So a
machine without PyAV still writes and reads GIFs, ``format=auto`` picks MP4
only where it can be written, a VideoWrite asked for ``mp4`` where PyAV is
missing is refused at validation, and a VideoLoad of an MP4 there fails with
the command that installs it (its path may come from an input, so it is not
known at validation).

VideoWrite writes under the media folder (``data/media``) and records the clip
as a ``media`` artifact of the run; VideoLoad reads a path relative to the
media folder, a ``data/...`` path, or an absolute one under the machine's
``CODEFYUI_READ_ROOTS``.
"""
from __future__ import annotations

import base64
import io
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cdui.nodes.base import ANY, SCALAR, STRING, TENSOR, Param, Port, install_hint, package_available
from cdui.nodes.builtin._declared import DeclaredNode

if TYPE_CHECKING:  # pragma: no cover
    from cdui.core.layout import Layout
    from cdui.graph.context import RunContext

PREVIEW_MAX_SIDE = 256  # the preview rides the event stream: keep it small
CONTAINERS = {".mp4": "h264", ".webm": "libvpx-vp9"}


def video_codecs_available() -> bool:
    """Whether MP4/WebM can be encoded and decoded here (PyAV, the ``video`` extra)."""
    return package_available("av")


def no_av_message(node: str, what: str) -> str:
    return f"{node}: {what} needs PyAV (av), which is not installed on this machine: {install_hint('video')}"


def frames_thwc(frames: Any) -> Any:
    """``(T, H, W, 3)`` uint8 from a frames tensor; the torch layout ``(T, C, H, W)`` wins when both axes
    could hold the channels. Floats are clamped to [0, 1]."""
    import torch

    if not isinstance(frames, torch.Tensor):
        raise ValueError(f"VideoWrite: frames must be a tensor, got {type(frames).__name__}")
    if frames.dim() != 4:
        raise ValueError(f"VideoWrite: frames must be 4-D (T, C, H, W) or (T, H, W, C), got shape "
                         f"{tuple(frames.shape)}")
    t = frames.detach().cpu()
    if t.shape[1] in (1, 3):
        t = t.permute(0, 2, 3, 1)
    elif t.shape[3] not in (1, 3):
        raise ValueError(f"VideoWrite: neither axis 1 nor axis 3 of shape {tuple(frames.shape)} is a channel "
                         f"count (1 or 3)")
    if t.shape[3] == 1:
        t = t.expand(-1, -1, -1, 3)
    if t.dtype != torch.uint8:
        t = (t.float().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)
    return t.contiguous()


def write_gif(frames: Any, path: Path, fps: float) -> None:
    from PIL import Image

    images = [Image.fromarray(f.numpy()) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=max(20, round(1000.0 / fps)), loop=0)


def write_av(frames: Any, path: Path, fps: float) -> None:
    """Encode with PyAV: H.264 in MP4 (yuv420p, so even sizes: the caller crops), VP9 in WebM."""
    import av

    with av.open(str(path), mode="w") as container:
        stream: Any = container.add_stream(CONTAINERS[path.suffix.lower()],
                                           rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame.numpy(), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def read_gif(path: Path, max_frames: int, stride: int) -> tuple[list[Any], float]:
    import numpy as np
    from PIL import Image, ImageSequence

    kept, durations = [], []
    with Image.open(path) as image:
        for index, frame in enumerate(ImageSequence.Iterator(image)):
            durations.append(int(frame.info.get("duration", 0)) or 100)
            if index % stride:
                continue
            kept.append(np.asarray(frame.convert("RGB")))
            if max_frames and len(kept) >= max_frames:
                break
    return kept, 1000.0 / (sum(durations) / len(durations)) if durations else 10.0


def read_av(path: Path, max_frames: int, stride: int) -> tuple[list[Any], float]:
    import av

    kept = []
    with av.open(str(path)) as container:
        if not container.streams.video:
            raise ValueError(f"VideoLoad: {path.name} has no video stream")
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        fps = float(rate) if rate else 10.0
        for index, frame in enumerate(container.decode(stream)):
            if index % stride:
                continue
            kept.append(frame.to_ndarray(format="rgb24"))
            if max_frames and len(kept) >= max_frames:
                break
    return kept, fps


class VideoWriteNode(DeclaredNode):
    NODE_NAME, CATEGORY = "VideoWrite", "IO"
    DESCRIPTION = "Encode frames to mp4 or gif in the media directory"
    NEEDS: ClassVar[tuple[str, ...]] = ("PIL", "numpy")
    EXTRA: ClassVar[str | None] = "video"
    WRITES_TO = "media"
    INPUTS = (Port("frames", TENSOR, "Video frames: (T,C,H,W) or (T,H,W,C), float [0,1] or uint8, gray or RGB"),)
    OUTPUTS = (Port("video", ANY, "Playable-clip reference (path, format, fps, frames, width, height, bytes)"),
               Port("path", STRING, "Absolute path of the written file"),
               Port("preview", STRING, "Middle frame as a base64 PNG"))
    PARAMS = (Param("filename", "output_path", "clip",
                    "Name under the media folder (subfolders allowed); the extension follows the format. "
                    "The same name overwrites"),
              Param("format", "select", "auto", "auto: mp4 where PyAV (the video extra) is installed, else gif",
                    options=["auto", "mp4", "gif"]),
              Param("fps", "float", 10.0, "Playback frames per second", min_value=0.5, max_value=60.0),
              Param("resize", "int", 0, "Output height in pixels, aspect kept, nearest neighbour (0 = native)",
                    min_value=0))

    @classmethod
    def preflight(cls, params: dict[str, Any], layout: Layout) -> list[tuple[str, str]]:
        found = super().preflight(params, layout)
        if not found and str(params.get("format") or "auto") == "mp4" and not video_codecs_available():
            found.append(("missing_extra", no_av_message(cls.NODE_NAME, "format mp4")))
        return found

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch
        from PIL import Image

        frames = frames_thwc(inputs.get("frames"))
        if frames.shape[0] == 0:
            raise ValueError("VideoWrite: the frames tensor has zero frames")
        fps = float(params.get("fps") or 10.0)
        if not 0.5 <= fps <= 60.0:
            raise ValueError(f"VideoWrite: fps must be between 0.5 and 60, got {fps:g}")
        resize = max(0, int(params.get("resize") or 0))
        if resize and resize != frames.shape[1]:
            width = max(2, round(frames.shape[2] * resize / frames.shape[1]))
            scaled = torch.nn.functional.interpolate(frames.permute(0, 3, 1, 2).float(), size=(resize, width),
                                                     mode="nearest")
            frames = scaled.round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()
        fmt = str(params.get("format") or "auto")
        if fmt not in ("auto", "mp4", "gif"):
            raise ValueError(f"VideoWrite: format {fmt!r} is not one of auto, mp4, gif")
        if fmt == "auto":
            fmt = "mp4" if video_codecs_available() else "gif"
        if fmt == "mp4":
            if not video_codecs_available():
                raise ValueError(no_av_message("VideoWrite", "format mp4"))
            # H.264 in yuv420p halves chroma: even sizes only. Cropped here so the reference tells the truth.
            frames = frames[:, :frames.shape[1] - frames.shape[1] % 2, :frames.shape[2] - frames.shape[2] % 2]
        name = str(params.get("filename") or "clip").strip() or "clip"
        name = str(Path(name).with_suffix("." + fmt)) if Path(name).suffix.lower() != "." + fmt else name
        path = ctx.output_path("media", name)
        if fmt == "gif":
            write_gif(frames, path, fps)
        else:
            write_av(frames, path, fps)
        image = Image.fromarray(frames[frames.shape[0] // 2].numpy())
        image.thumbnail((PREVIEW_MAX_SIDE, PREVIEW_MAX_SIDE))
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        ctx.artifact("media", path, name)
        size = path.stat().st_size
        ctx.log(f"Wrote {name} ({fmt}, {frames.shape[0]} frames at {fps:g} fps, {size:,} bytes)")
        reference = {"path": name, "format": fmt, "fps": fps, "frames": int(frames.shape[0]),
                     "width": int(frames.shape[2]), "height": int(frames.shape[1]), "bytes": size}
        return {"video": reference, "path": str(path), "preview": base64.b64encode(buf.getvalue()).decode("ascii")}


class VideoLoadNode(DeclaredNode):
    NODE_NAME, CATEGORY = "VideoLoad", "IO"
    DESCRIPTION = "Decode video to frames (T,3,H,W), fps and frame count"
    NEEDS: ClassVar[tuple[str, ...]] = ("PIL", "numpy")
    EXTRA: ClassVar[str | None] = "video"
    INPUTS = (Port("path", STRING, "Video file path (overrides the path param when wired)", optional=True),)
    OUTPUTS = (Port("frames", TENSOR, "Decoded frames (T, 3, H, W), float [0,1]"),
               Port("fps", SCALAR, "Frames per second after stride"),
               Port("num_frames", SCALAR, "Number of decoded frames"))
    PARAMS = (Param("path", "path", "clip.mp4",
                    "Video file: relative to the media folder (where VideoWrite writes), data/..., or absolute "
                    "under CODEFYUI_READ_ROOTS"),
              Param("max_frames", "int", 0, "Stop after this many decoded frames (0 = all)", min_value=0),
              Param("stride", "int", 1, "Keep every Nth frame (fps output scales down to match)", min_value=1))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import numpy as np
        import torch

        raw = inputs.get("path") or params.get("path") or ""
        value = str(raw).strip()
        if not value:
            raise ValueError("VideoLoad: no path given")
        # A relative path is the media folder's (VideoWrite's output); data/... and absolute paths as usual.
        path = ctx.resolve_upload("media", value)
        if not path.is_file():
            raise FileNotFoundError(f"VideoLoad: file not found: {value!r} (looked at {path})")
        max_frames = max(0, int(params.get("max_frames") or 0))
        stride = max(1, int(params.get("stride") or 1))
        if path.suffix.lower() == ".gif":
            kept, fps = read_gif(path, max_frames, stride)
        else:
            if not video_codecs_available():
                raise ValueError(no_av_message("VideoLoad", f"reading {path.suffix or 'this file'}"))
            kept, fps = read_av(path, max_frames, stride)
        if not kept:
            raise ValueError(f"VideoLoad: no frames decoded from {path.name}")
        frames = torch.from_numpy(np.stack(kept)).permute(0, 3, 1, 2).float() / 255.0
        fps /= stride  # fps describes the frames returned, so the clip's duration holds
        ctx.log(f"Decoded {path.name}: {frames.shape[0]} frames ({frames.shape[3]}x{frames.shape[2]}) "
                f"at {fps:.2f} fps")
        return {"frames": frames, "fps": float(fps), "num_frames": int(frames.shape[0])}
