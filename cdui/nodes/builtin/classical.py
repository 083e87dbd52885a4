"""Classical (non-neural) classifiers: KNN and Accuracy.

CodefyUI's KNN wraps ``sklearn.neighbors.KNeighborsClassifier``; this one is
brute force in torch with the same rules, so its answers agree with sklearn's:

- classes are the sorted distinct training labels (``classes_``), and the
  columns of ``probabilities`` follow that order;
- ``weights="distance"`` weighs a neighbour by 1/d, and a query that sits
  exactly on training points is decided by those points alone;
- a tied vote goes to the class that sorts first.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdui.nodes.base import LIST, SCALAR, TENSOR, Node, Param, Port
from cdui.nodes.builtin._util import as_list, as_tensor

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

METRICS = ["minkowski", "euclidean", "manhattan", "chebyshev", "cosine"]


def pairwise_distances(xq: Any, xt: Any, metric: str) -> Any:
    import torch

    if metric in ("minkowski", "euclidean"):
        return torch.cdist(xq, xt, p=2.0)
    if metric == "manhattan":
        return torch.cdist(xq, xt, p=1.0)
    if metric == "chebyshev":
        return torch.cdist(xq, xt, p=float("inf"))
    if metric == "cosine":
        qn = xq / xq.norm(dim=1, keepdim=True).clamp_min(1e-300)
        tn = xt / xt.norm(dim=1, keepdim=True).clamp_min(1e-300)
        return (1.0 - qn @ tn.T).clamp_min(0.0)
    raise ValueError(f"KNN: unknown metric {metric!r}; use one of {METRICS}")


def knn_vote(dist: Any, y_idx: Any, n_classes: int, k: int, weights: str) -> Any:
    """Class probabilities [M, C] from the k nearest neighbours of each query."""
    import torch

    # Stable sort: equal distances keep training order, so the k-th place is
    # decided the same way on every run.
    order = torch.sort(dist, dim=1, stable=True).indices[:, :k]
    near = torch.gather(dist, 1, order)
    if weights == "distance":
        with torch.no_grad():
            w = 1.0 / near
            exact = torch.isinf(w)
            on_point = exact.any(dim=1, keepdim=True)
            w = torch.where(on_point, exact.to(w.dtype), w)
    elif weights == "uniform":
        w = torch.ones_like(near)
    else:
        raise ValueError(f"KNN: unknown weights {weights!r}; use uniform or distance")
    votes = torch.zeros(dist.shape[0], n_classes, dtype=dist.dtype)
    votes.scatter_add_(1, y_idx[order], w)
    total = votes.sum(dim=1, keepdim=True)
    return votes / torch.where(total == 0, torch.ones_like(total), total)


class KNNNode(Node):
    NODE_NAME = "KNN"
    CATEGORY = "Classical"
    DESCRIPTION = ("k-Nearest-Neighbours classifier: distance weighting and a choice of "
                   "metrics; same answers as scikit-learn's KNeighborsClassifier.")

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [
            Port("x_train", TENSOR, "Training features [N, F]."),
            Port("y_train", LIST, "Training labels (length N)."),
            Port("x_query", TENSOR, "Query features [M, F] to classify."),
        ]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("predictions", LIST, "Predicted label per query."),
            Port("probabilities", TENSOR, "Class probabilities [M, C] from the k-NN vote."),
            Port("classes", LIST, "Class labels in column order (sorted)."),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("n_neighbors", "int", 5, "Number of neighbours k.", min_value=1),
            Param("weights", "select", "uniform",
                  "Vote weighting: uniform = each neighbour counts the same; "
                  "distance = closer neighbours count more.", options=["uniform", "distance"]),
            Param("metric", "select", "minkowski", "Distance metric. minkowski (p=2) == euclidean.",
                  options=METRICS),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch

        x_train = as_tensor(inputs.get("x_train"), "x_train").detach().cpu().double()
        x_query = as_tensor(inputs.get("x_query"), "x_query").detach().cpu().double()
        if inputs.get("y_train") is None:
            raise ValueError("KNN requires `x_train`, `y_train`, and `x_query` inputs")
        labels = as_list(inputs["y_train"])
        if x_train.shape[0] != len(labels):
            raise ValueError(f"KNN: features and labels length mismatch: "
                             f"{x_train.shape[0]} rows vs {len(labels)} labels")
        if not labels:
            raise ValueError("KNN: the training set is empty")
        if x_train.dim() != 2 or x_query.dim() != 2 or x_train.shape[1] != x_query.shape[1]:
            raise ValueError(f"KNN: x_train {tuple(x_train.shape)} and x_query "
                             f"{tuple(x_query.shape)} must be 2-D with the same number of columns")
        classes = sorted(set(labels))
        index_of = {c: i for i, c in enumerate(classes)}
        y_idx = torch.tensor([index_of[v] for v in labels], dtype=torch.long)
        k = max(1, min(int(params.get("n_neighbors", 5)), len(labels)))
        dist = pairwise_distances(x_query, x_train, str(params.get("metric") or "minkowski"))
        proba = knn_vote(dist, y_idx, len(classes), k, str(params.get("weights") or "uniform"))
        preds = [str(classes[i]) for i in proba.argmax(dim=1).tolist()]
        return {"predictions": preds, "probabilities": proba.float(),
                "classes": [str(c) for c in classes]}


class AccuracyNode(Node):
    NODE_NAME = "Accuracy"
    CATEGORY = "Classical"
    DESCRIPTION = ("Compute classification accuracy between a predictions list and a "
                   "ground-truth labels list: accuracy (0-1), correct count and total.")

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [
            Port("predictions", LIST, "Predicted labels (length N)."),
            Port("labels", LIST, "Ground-truth labels (length N)."),
        ]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("accuracy", SCALAR, "Accuracy in [0, 1]."),
            Port("correct", SCALAR, "Number of correct predictions."),
            Port("total", SCALAR, "Number of samples compared."),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        if inputs.get("predictions") is None or inputs.get("labels") is None:
            raise ValueError("Accuracy requires `predictions` and `labels` inputs")
        preds = as_list(inputs["predictions"])
        labels = as_list(inputs["labels"])
        if len(preds) != len(labels):
            raise ValueError(f"Accuracy: length mismatch: predictions {len(preds)} vs labels {len(labels)}")
        if not preds:
            return {"accuracy": 0.0, "correct": 0, "total": 0}
        # Strings on both sides, so '0' and 0 compare equal.
        correct = sum(1 for p, y in zip(preds, labels, strict=True) if str(p) == str(y))
        return {"accuracy": correct / len(preds), "correct": correct, "total": len(preds)}
