"""Plot nodes (the ``plots`` extra, matplotlib): Visualize, ScatterPlot2D and
DecisionBoundary.

CodefyUI's output contract: the single output ``image`` is the base64 text of
a PNG (no ``data:`` prefix) drawn with matplotlib's Agg backend, 8x6 inches at
100 dpi for Visualize (800x600) and 6x6 for the other two, with a tight
layout. cdui also keeps each picture as a ``media`` artifact of the run
(``data/media/<run id>/<node id>.png``), so the run view can show it and it can
be downloaded like any output.
"""
from __future__ import annotations

import base64
import io
import math
from typing import TYPE_CHECKING, Any, ClassVar

from cdui.nodes.base import ANY, LIST, MODEL, STRING, Param, Port
from cdui.nodes.builtin._declared import B, DeclaredNode, I, T, int_param
from cdui.nodes.builtin._util import as_bool, as_list

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

PLOT_TYPES = ["line", "histogram", "heatmap", "image"]
IMAGE_OUT = (Port("image", STRING, "PNG as base64 text"),)


class PlotNode(DeclaredNode):
    NEEDS: ClassVar[tuple[str, ...]] = ("matplotlib", "numpy")
    EXTRA: ClassVar[str | None] = "plots"
    # Every run of a plot node writes its picture (into data/media/), so runs
    # that use one go where files can be written (see cdui.plane.sched.placement).
    ALWAYS_WRITES: ClassVar[str | None] = "media"

    @staticmethod
    def figure(width: float, height: float) -> tuple[Any, Any]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(width, height), dpi=100)
        return fig, ax

    def finish(self, fig: Any, ctx: RunContext) -> dict[str, Any]:
        import matplotlib.pyplot as plt

        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        png = buf.getvalue()
        path = ctx.output_path("media", f"{ctx.run_id}/{ctx.node_id or self.NODE_NAME}.png")
        path.write_bytes(png)
        ctx.artifact("media", path, path.name)
        return {"image": base64.b64encode(png).decode("ascii")}


def _array(value: Any, name: str) -> Any:
    import numpy as np
    import torch

    if value is None:
        raise ValueError(f"input {name!r} is not connected or carried no value")
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().float().numpy()
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"input {name!r} holds {type(value).__name__}, not numbers that can be plotted") from None


def _image_grid(a: Any) -> Any:
    """(H, W), (C, H, W) or (N, C, H, W) as an (H, W[, C]) picture; a batch is tiled."""
    import numpy as np

    if a.ndim == 4 and a.shape[0] == 1:
        a = a[0]
    if a.ndim == 4:
        n, c, h, w = a.shape
        cols = math.ceil(math.sqrt(n))
        rows = math.ceil(n / cols)
        grid = np.zeros((c, rows * h, cols * w), dtype=a.dtype)
        for i in range(n):
            r, k = divmod(i, cols)
            grid[:, r * h:(r + 1) * h, k * w:(k + 1) * w] = a[i]
        a = grid
    if a.ndim == 3:
        a = a[0] if a.shape[0] == 1 else np.transpose(a, (1, 2, 0))
    if a.ndim != 2 and not (a.ndim == 3 and a.shape[2] in (3, 4)):
        raise ValueError(f"Visualize: plot_type=image needs (H, W), (C, H, W) or (N, C, H, W), got shape {a.shape}")
    return np.clip(a, 0.0, 1.0) if a.dtype.kind == "f" else a


class VisualizeNode(PlotNode):
    NODE_NAME, CATEGORY = "Visualize", "Utility"
    DESCRIPTION = "Draw a tensor or list as a line, histogram, heatmap or image (a PNG)"
    INPUTS = (Port("data", ANY, "A tensor, list or array"),)
    OUTPUTS = IMAGE_OUT
    PARAMS = (Param("title", "string", "", "Title of the plot"),
              Param("plot_type", "select", "line", "Kind of plot", options=PLOT_TYPES))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import numpy as np

        a = _array(inputs.get("data"), "data")
        kind = str(params.get("plot_type") or "line")
        fig, ax = self.figure(8, 6)
        if kind == "line":
            ax.plot(a.reshape(-1))
        elif kind == "histogram":
            ax.hist(a.reshape(-1), bins=50)
        elif kind == "heatmap":
            if a.ndim <= 1:
                flat = a.reshape(-1)
                side = max(1, math.ceil(math.sqrt(flat.size)))
                a = np.pad(flat, (0, side * side - flat.size)).reshape(side, side)
            elif a.ndim > 2:
                a = a.reshape(-1, a.shape[-1])
            fig.colorbar(ax.imshow(a, aspect="auto", cmap="viridis"), ax=ax)
        elif kind == "image":
            picture = _image_grid(a)
            ax.imshow(picture, cmap="gray" if picture.ndim == 2 else None)
            ax.axis("off")
        else:
            raise ValueError(f"Visualize: unknown plot_type {kind!r}; use one of {PLOT_TYPES}")
        if params.get("title"):
            ax.set_title(str(params["title"]))
        return self.finish(fig, ctx)


class ScatterPlot2DNode(PlotNode):
    NODE_NAME, CATEGORY = "ScatterPlot2D", "Utility"
    DESCRIPTION = "Scatter plot of 2-D points, one colour per label (a PNG)"
    INPUTS = (T("points", "Points [N, 2]"), Port("labels", LIST, "A label per point", optional=True))
    OUTPUTS = IMAGE_OUT
    PARAMS = (Param("title", "string", "", "Title of the plot"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        pts = _array(inputs.get("points"), "points")
        if pts.ndim != 2 or pts.shape[1] != 2:
            raise ValueError(f"ScatterPlot2D: points must be [N, 2], got shape {pts.shape}")
        fig, ax = self.figure(6, 6)
        labels = inputs.get("labels")
        if labels is None:
            ax.scatter(pts[:, 0], pts[:, 1], s=12)
        else:
            names = [str(v) for v in as_list(labels)]
            if len(names) != len(pts):
                raise ValueError(f"ScatterPlot2D: {len(pts)} points but {len(names)} labels")
            for label in sorted(set(names)):
                idx = [i for i, n in enumerate(names) if n == label]
                ax.scatter(pts[idx, 0], pts[idx, 1], s=12, label=label)
            ax.legend()
        if params.get("title"):
            ax.set_title(str(params["title"]))
        return self.finish(fig, ctx)


class DecisionBoundaryNode(PlotNode):
    NODE_NAME, CATEGORY = "DecisionBoundary", "Utility"
    DESCRIPTION = "Colour the regions a 2-D classifier assigns to each class, with the training points (a PNG)"
    INPUTS = (Port("model", MODEL, "A fitted classifier with predict()"), T("x_train", "Training points [N, 2]"),
              Port("y_train", LIST, "Their labels"))
    OUTPUTS = IMAGE_OUT
    PARAMS = (I("grid_steps", 200, "Grid points per axis", lo=20, hi=500),
              B("show_support_vectors", False, "Circle an SVM's support vectors"),
              Param("title", "string", "", "Title of the plot"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import numpy as np

        model = inputs.get("model")
        if model is None or not callable(getattr(model, "predict", None)):
            raise ValueError("DecisionBoundary: the model input has no predict() (it needs a fitted classifier "
                             "such as a scikit-learn model)")
        pts = _array(inputs.get("x_train"), "x_train")
        if pts.ndim != 2 or pts.shape[1] != 2:
            raise ValueError(f"DecisionBoundary: x_train must be [N, 2], got shape {pts.shape}")
        labels = [str(v) for v in as_list(inputs.get("y_train"))]
        steps = max(20, min(500, int_param(params, "grid_steps", 200)))
        pad = 0.5
        xs = np.linspace(pts[:, 0].min() - pad, pts[:, 0].max() + pad, steps)
        ys = np.linspace(pts[:, 1].min() - pad, pts[:, 1].max() + pad, steps)
        gx, gy = np.meshgrid(xs, ys)
        pred = [str(v) for v in model.predict(np.c_[gx.ravel(), gy.ravel()])]
        classes = sorted(set(pred) | set(labels))
        index = {c: i for i, c in enumerate(classes)}
        fig, ax = self.figure(6, 6)
        ax.contourf(gx, gy, np.array([index[p] for p in pred]).reshape(gx.shape), alpha=0.3, cmap="tab10",
                    levels=np.arange(len(classes) + 1) - 0.5)
        for c in classes:
            idx = [i for i, n in enumerate(labels) if n == c]
            if idx:
                ax.scatter(pts[idx, 0], pts[idx, 1], s=12, label=c)
        if as_bool(params.get("show_support_vectors")) and hasattr(model, "support_vectors_"):
            sv = np.asarray(model.support_vectors_)
            ax.scatter(sv[:, 0], sv[:, 1], s=60, facecolors="none", edgecolors="k", label="support vectors")
        ax.legend()
        if params.get("title"):
            ax.set_title(str(params["title"]))
        return self.finish(fig, ctx)
