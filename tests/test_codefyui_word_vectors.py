"""WordVector and EmbeddingScatter against known results: the demo-16d
vocabulary's own arithmetic, and scikit-learn's PCA / t-SNE as the reference
for the projection."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cdui.core.layout import Layout
from cdui.graph.context import RunContext
from cdui.nodes.builtin.word_vectors import DEMO_16D, EmbeddingScatterNode, WordVectorNode


def ctx(tmp_path: Path) -> RunContext:
    return RunContext("run-1", Layout.for_data_dir(tmp_path), emit=lambda kind, data: None)


def words(tmp_path: Path, tokens: Any = None, **params: Any) -> dict[str, Any]:
    inputs = {} if tokens is None else {"tokens": tokens}
    return WordVectorNode().execute(inputs, {"backend": "demo-16d", **params}, ctx(tmp_path))


def vec(*pairs: tuple[int, float]) -> list[float]:
    row = [0.0] * 16
    for i, v in pairs:
        row[i] = v
    return row


def test_the_vocabulary_is_codefyuis_59_words() -> None:
    assert len(DEMO_16D) == 59
    assert all(0 <= i < 16 and 0.0 < v <= 1.0 for dims in DEMO_16D.values() for i, v in dims.items())


@pytest.mark.parametrize(("params", "tokens", "labels", "rows"), [
    # the param: whitespace and commas split, case folded, unknown words dropped
    ({"words": "King, queen  unicorn"}, None, ["king", "queen"], [vec((0, 1.0), (2, 1.0)), vec((0, 1.0), (3, 1.0))]),
    # keep_oov: a zero row under the unknown word's label
    ({"words": "unicorn sister", "keep_oov": True}, None, ["unicorn", "sister"],
     [vec(), vec((2, 0.1), (3, 0.9), (4, 0.4))]),
    # a wired list is taken item by item (not split), empty items skipped; it wins over the param
    ({"words": "king"}, ["Fly", " ", "whale"], ["fly", "whale"],
     [vec((6, 0.4), (9, 1.0), (13, 0.6)), vec((5, 0.6), (7, 1.0))]),
    # a wired string is split like the param
    ({"words": "king"}, "cat,dog", ["cat", "dog"], [vec((5, 1.0)), vec((5, 1.0))]),
])
def test_word_lookup(tmp_path: Path, params: dict[str, Any], tokens: Any, labels: list[str],
                     rows: list[list[float]]) -> None:
    out = words(tmp_path, tokens, **params)
    assert out["labels"] == labels
    assert out["embeddings"].dtype == torch.float32
    assert torch.equal(out["embeddings"], torch.tensor(rows))


def test_normalize_gives_unit_rows_and_leaves_zero_rows(tmp_path: Path) -> None:
    out = words(tmp_path, words="sister unicorn", normalize=True, keep_oov=True)
    sister = torch.tensor(vec((2, 0.1), (3, 0.9), (4, 0.4)))
    assert torch.allclose(out["embeddings"][0], sister / sister.norm())
    assert torch.equal(out["embeddings"][1], torch.zeros(16))


def test_no_known_word_gives_an_empty_matrix(tmp_path: Path) -> None:
    out = words(tmp_path, words="unicorn dragon")
    assert out["labels"] == [] and out["embeddings"].shape == (0, 16)


def test_king_minus_man_plus_woman_is_queen(tmp_path: Path) -> None:
    e = words(tmp_path, words="king man woman queen")["embeddings"]
    assert torch.equal(e[0] - e[1] + e[2], e[3])


def scatter(tmp_path: Path, x: torch.Tensor, labels: Any = None, **params: Any) -> dict[str, Any]:
    inputs: dict[str, Any] = {"embeddings": x}
    if labels is not None:
        inputs["labels"] = labels
    return EmbeddingScatterNode().execute(inputs, params, ctx(tmp_path))


def centred_scaled(points: Any) -> torch.Tensor:
    p = torch.as_tensor(points, dtype=torch.float32)
    p = p - p.mean(dim=0, keepdim=True)
    return p / p.abs().max()


X = torch.tensor([[float((i * 7 + j * 3) % 11) for j in range(6)] for i in range(8)])


def test_pca_is_sklearns_centred_and_scaled(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="EmbeddingScatter needs the classical extra (scikit-learn)")
    from sklearn.decomposition import PCA

    out = scatter(tmp_path, X, [f"w{i}" for i in range(10)], method="PCA", seed=42)
    want = centred_scaled(PCA(n_components=2, random_state=42).fit_transform(X.numpy()))
    assert out["points_2d"].shape == (8, 2) and out["points_2d"].dtype == torch.float32
    assert torch.allclose(out["points_2d"], want, atol=1e-6)
    assert float(out["points_2d"].abs().max()) == pytest.approx(1.0)
    assert out["labels"] == [f"w{i}" for i in range(8)]  # cut to N


def test_tsne_is_sklearns_with_the_perplexity_capped(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="EmbeddingScatter needs the classical extra (scikit-learn)")
    from sklearn.manifold import TSNE

    out = scatter(tmp_path, X, method="t-SNE", perplexity=50.0, seed=3)
    want = TSNE(n_components=2, perplexity=7.0, random_state=3, init="pca",
                learning_rate="auto").fit_transform(X.numpy())
    assert torch.allclose(out["points_2d"], centred_scaled(want), atol=1e-5)
    assert out["labels"] == []


def test_tsne_on_fewer_than_five_points_falls_back_to_pca(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="EmbeddingScatter needs the classical extra (scikit-learn)")
    few = X[:4]
    assert torch.equal(scatter(tmp_path, few, method="t-SNE")["points_2d"],
                       scatter(tmp_path, few, method="PCA")["points_2d"])


def test_one_vector_is_one_point_at_the_origin(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="EmbeddingScatter needs the classical extra (scikit-learn)")
    assert torch.equal(scatter(tmp_path, torch.ones(16))["points_2d"], torch.zeros(1, 2))


def test_a_three_dimensional_tensor_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"EmbeddingScatter: embeddings must be \[N, D\], got shape \(2, 3, 4\)"):
        scatter(tmp_path, torch.zeros(2, 3, 4))
