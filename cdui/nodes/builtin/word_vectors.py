"""CodefyUI's word-vector teaching pair: ``WordVector`` (look words up in a
small built-in vocabulary) and ``EmbeddingScatter`` (project vectors to 2-D).

``demo-16d`` is CodefyUI's hand-built vocabulary of 59 words in 16
interpretable dimensions, made so that ``king - man + woman`` lands exactly on
``queen`` with no download. The numbers here are CodefyUI's (a graph must give
the same answer on both sides), held as each word's non-zero dimensions. The
lookup needs nothing beyond torch; CodefyUI's needs numpy.

``EmbeddingScatter`` uses scikit-learn's PCA and t-SNE (the ``classical``
extra), as CodefyUI does, then centres the points and scales them so the
largest coordinate is 1.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from cdui.nodes.base import LIST, Param, Port
from cdui.nodes.builtin._declared import B, DeclaredNode, F, I, T, float_param, int_param
from cdui.nodes.builtin._util import as_bool, resolve_device

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

LLM = "LLM"
DIM = 16
# Dimensions: 0 royalty, 1 divinity, 2 masculine, 3 feminine, 4 young, 5 mammal, 6 bird,
# 7 water, 8 insect, 9 physical motion, 10 mental activity, 11 land vehicle,
# 12 water vehicle, 13 flying, 14 food, 15 weather.
DEMO_16D: dict[str, dict[int, float]] = {
    "king": {0: 1.0, 2: 1.0}, "queen": {0: 1.0, 3: 1.0},
    "prince": {0: 0.7, 2: 1.0, 4: 0.5}, "princess": {0: 0.7, 3: 1.0, 4: 0.5},
    "duke": {0: 0.5, 2: 1.0}, "duchess": {0: 0.5, 3: 1.0},
    "man": {2: 1.0}, "woman": {3: 1.0}, "boy": {2: 1.0, 4: 1.0}, "girl": {3: 1.0, 4: 1.0},
    "father": {2: 1.0}, "mother": {3: 1.0},
    "brother": {2: 0.9, 3: 0.1, 4: 0.4}, "sister": {2: 0.1, 3: 0.9, 4: 0.4},
    "god": {0: 0.7, 1: 1.0, 2: 0.7}, "goddess": {0: 0.7, 1: 1.0, 3: 0.7}, "angel": {1: 1.0, 13: 1.0},
    "cat": {5: 1.0}, "dog": {5: 1.0}, "horse": {5: 1.0, 9: 0.4}, "lion": {5: 1.0}, "tiger": {5: 1.0},
    "rabbit": {5: 1.0}, "kitten": {4: 1.0, 5: 1.0}, "puppy": {4: 1.0, 5: 1.0},
    "bird": {6: 1.0}, "eagle": {6: 1.0, 13: 0.4}, "sparrow": {6: 1.0}, "owl": {6: 1.0},
    "fish": {7: 1.0}, "shark": {7: 1.0}, "whale": {5: 0.6, 7: 1.0}, "dolphin": {5: 0.6, 7: 1.0},
    "bee": {8: 1.0, 13: 0.4}, "ant": {8: 1.0}, "butterfly": {8: 1.0},
    "run": {9: 1.0}, "walk": {9: 1.0}, "swim": {7: 0.5, 9: 1.0}, "fly": {6: 0.4, 9: 1.0, 13: 0.6},
    "jump": {9: 1.0}, "think": {10: 1.0}, "imagine": {10: 1.0}, "remember": {10: 1.0}, "dream": {10: 1.0},
    "car": {11: 1.0}, "truck": {11: 1.0}, "bus": {11: 1.0}, "boat": {12: 1.0}, "ship": {12: 1.0},
    "plane": {13: 1.0},
    "bread": {14: 1.0}, "apple": {14: 1.0}, "cheese": {14: 1.0}, "pizza": {14: 1.0},
    "rain": {7: 0.4, 15: 1.0}, "snow": {15: 1.0}, "sun": {1: 0.5, 15: 1.0}, "wind": {15: 1.0},
}
BACKENDS = ["demo-16d"]
# Most words one WordVector looks up, and most values EmbeddingScatter projects:
# a typo in an upstream node must not allocate gigabytes.
MAX_WORDS = 100_000
MAX_ELEMENTS = 64 * 1024 * 1024
# t-SNE compares every pair of points; beyond this it runs for hours.
MAX_TSNE_POINTS = 10_000


def demo_vector(word: str) -> list[float] | None:
    """The demo-16d vector of ``word`` (already lower-cased), or None when the
    vocabulary lacks it."""
    dims = DEMO_16D.get(word)
    if dims is None:
        return None
    row = [0.0] * DIM
    for i, v in dims.items():
        row[i] = v
    return row


def split_words(tokens: Any, words: Any) -> list[str]:
    """The words to look up: a wired list as it is (one word per item), else the
    ``words`` param (or a wired string) split on whitespace and commas."""
    if isinstance(tokens, (list, tuple)):
        if len(tokens) > MAX_WORDS:
            raise ValueError(f"WordVector: {len(tokens)} tokens, more than the {MAX_WORDS} one node looks up")
        return [str(t) for t in tokens]
    text = str(words if tokens is None else tokens)
    out = text.replace(",", " ").split()
    if len(out) > MAX_WORDS:
        raise ValueError(f"WordVector: {len(out)} words, more than the {MAX_WORDS} one node looks up")
    return out


class WordVectorNode(DeclaredNode):
    NODE_NAME, CATEGORY = "WordVector", LLM
    DESCRIPTION = ("Look each word up in a built-in vocabulary (demo-16d: 59 words, 16 dimensions, "
                   "made so that king - man + woman = queen); [N, 16] and the words found")
    INPUTS = (Port("tokens", LIST, "Words to look up (else the words param)", optional=True),)
    OUTPUTS = (T("embeddings", "[N, D], one row per word found"),
               Port("labels", LIST, "The words found, lower-cased, in input order"))
    PARAMS = (Param("backend", "select", "demo-16d", "Vector source", options=BACKENDS),
              Param("words", "string", "king queen man woman cat dog",
                    "Words separated by spaces or commas, used when tokens is not wired"),
              B("normalize", False, "Scale each row to unit length"),
              B("keep_oov", False, "Give unknown words a zero row instead of dropping them"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        backend = str(params.get("backend") or "demo-16d")
        if backend not in BACKENDS:
            raise ValueError(f"WordVector: backend {backend!r} is not available; cdui has {BACKENDS}")
        keep_oov = as_bool(params.get("keep_oov"))
        rows: list[list[float]] = []
        labels: list[str] = []
        unknown: list[str] = []
        for word in split_words(inputs.get("tokens"), params.get("words", "")):
            key = word.strip().lower()
            if not key:
                continue
            row = demo_vector(key)
            if row is None:
                unknown.append(key)
                if not keep_oov:
                    continue
                row = [0.0] * DIM
            rows.append(row)
            labels.append(key)
        if unknown:
            ctx.log(f"WordVector: {len(unknown)} word(s) not in {backend}"
                    f"{' (zero rows)' if keep_oov else ' (dropped)'}: {', '.join(unknown[:10])}")
        x = torch.tensor(rows, dtype=torch.float32) if rows else torch.zeros((0, DIM), dtype=torch.float32)
        if as_bool(params.get("normalize")) and rows:
            norms = x.norm(dim=1, keepdim=True)
            x = x / torch.where(norms == 0, torch.ones_like(norms), norms)
        return {"embeddings": x.to(resolve_device("auto", ctx)), "labels": labels}


class EmbeddingScatterNode(DeclaredNode):
    NODE_NAME, CATEGORY = "EmbeddingScatter", LLM
    DESCRIPTION = ("Project [N, D] vectors to [N, 2] with PCA or t-SNE (scikit-learn), centred and "
                   "scaled so the largest coordinate is 1")
    NEEDS: ClassVar[tuple[str, ...]] = ("sklearn", "numpy")
    EXTRA: ClassVar[str | None] = "classical"
    INPUTS = (T("embeddings", "[N, D] (a single [D] vector counts as N=1)"),
              Port("labels", LIST, "N labels, passed through", optional=True))
    OUTPUTS = (T("points_2d", "[N, 2] in [-1, 1]"), Port("labels", LIST, "The labels, cut to N"))
    PARAMS = (Param("method", "select", "PCA", "PCA (linear, deterministic) or t-SNE (neighbourhoods)",
                    options=["PCA", "t-SNE"]),
              F("perplexity", 5.0, "t-SNE neighbourhood size (capped at N-1)", lo=2.0, hi=50.0),
              I("seed", 42, "Random seed of PCA's solver and of t-SNE"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import numpy as np
        import torch

        x = self.float_tensor(inputs, "embeddings").detach().cpu()
        if x.dim() == 1:
            x = x.reshape(1, -1)
        if x.dim() != 2:
            raise ValueError(f"EmbeddingScatter: embeddings must be [N, D], got shape {tuple(x.shape)}")
        if x.numel() > MAX_ELEMENTS:
            raise ValueError(f"EmbeddingScatter: {x.numel()} values, more than the {MAX_ELEMENTS} it projects")
        arr = x.numpy().astype(np.float32, copy=False)
        n, d = arr.shape
        method, seed = str(params.get("method") or "PCA"), int_param(params, "seed", 42)
        if method == "t-SNE" and n < 5:
            # t-SNE needs a few neighbours per point; CodefyUI falls back the same way.
            ctx.log(f"EmbeddingScatter: t-SNE needs at least 5 points, got {n}; using PCA")
            method = "PCA"
        if method == "t-SNE":
            from sklearn.manifold import TSNE

            if n > MAX_TSNE_POINTS:
                raise ValueError(f"EmbeddingScatter: t-SNE on {n} points (at most {MAX_TSNE_POINTS}); use PCA")
            perplexity = max(2.0, min(float_param(params, "perplexity", 5.0), n - 1))
            points = TSNE(n_components=2, perplexity=perplexity, random_state=seed, init="pca",
                          learning_rate="auto").fit_transform(arr)
        elif n <= 1 or d == 0:
            # Nothing to spread: one point is the origin once centred (and sklearn's PCA
            # divides its variance by n - 1).
            points = np.zeros((n, 2), dtype=np.float32)
        else:
            from sklearn.decomposition import PCA

            k = min(2, n, d)
            points = PCA(n_components=k, random_state=seed).fit_transform(arr)
            if k < 2:
                points = np.concatenate([points, np.zeros((n, 2 - k), dtype=points.dtype)], axis=1)
        points = points.astype(np.float32, copy=False)
        if n:
            points = points - points.mean(axis=0, keepdims=True)
            scale = float(np.max(np.abs(points)))
            if scale > 0:
                points = points / scale
        labels = list(inputs.get("labels") or [])
        return {"points_2d": torch.from_numpy(np.ascontiguousarray(points, dtype=np.float32)),
                "labels": labels[:n]}
