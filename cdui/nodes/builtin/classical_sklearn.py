"""Classical models from scikit-learn (the ``classical`` extra), as CodefyUI's
nodes wrap them: fit on ``x_train`` / ``y_train``, answer for ``x_query``.

Labels are compared as strings (CodefyUI stringifies them), so ``classes`` is
sklearn's ``classes_``: the sorted distinct labels, and the columns of
``probabilities`` follow it. A graph using one of these nodes on a machine
without scikit-learn is refused at validation with the install command.
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, ClassVar

from cdui.nodes.base import LIST, SCALAR, STRING, Param, Port
from cdui.nodes.builtin._declared import B, DeclaredNode, F, I, T, float_param, int_param
from cdui.nodes.builtin._util import as_bool, as_list, parse_int_list

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

_FIT_INPUTS = (T("x_train", "Training features [N, F]"), Port("y_train", LIST, "Training labels (N)"),
               T("x_query", "Features to predict [M, F]"))


class SklearnNode(DeclaredNode):
    """Base of the scikit-learn nodes (no NODE_NAME: not registered itself)."""

    NEEDS: ClassVar[tuple[str, ...]] = ("sklearn", "numpy")
    EXTRA: ClassVar[str | None] = "classical"

    def arrays(self, inputs: dict[str, Any], labels: bool = True) -> tuple[Any, Any, Any]:
        x = self.float_tensor(inputs, "x_train").detach().cpu().double().numpy()
        q = self.float_tensor(inputs, "x_query").detach().cpu().double().numpy()
        if x.ndim != 2 or q.ndim != 2 or x.shape[1] != q.shape[1]:
            raise ValueError(f"{self.NODE_NAME}: x_train {tuple(x.shape)} and x_query {tuple(q.shape)} must be "
                             f"[N, F] and [M, F] with the same F")
        if labels:
            if inputs.get("y_train") is None:
                raise ValueError(f"{self.NODE_NAME}: input 'y_train' is not connected or carried no value")
            y = [str(v) for v in as_list(inputs.get("y_train"))]
        else:
            y = self.float_tensor(inputs, "y_train").detach().cpu().double().numpy()
        if len(y) != x.shape[0]:
            raise ValueError(f"{self.NODE_NAME}: {x.shape[0]} training rows but {len(y)} labels")
        return x, y, q

    @staticmethod
    def tensor_of(array: Any) -> Any:
        import torch

        return torch.as_tensor(array, dtype=torch.float32)


class DecisionTreeClassifierNode(SklearnNode):
    NODE_NAME, CATEGORY = "DecisionTreeClassifier", "Classical"
    DESCRIPTION = "A decision tree (CART): predictions, feature importances and the tree's rules as text"
    INPUTS = _FIT_INPUTS
    OUTPUTS = (Port("predictions", LIST, "Predicted labels"), T("feature_importances", "Importance per feature"),
               Port("tree_text", STRING, "The rules, one line per split"), Port("classes", LIST, "Class names"))
    PARAMS = (I("max_depth", 5, "Deepest split; 0 for no limit", lo=0),
              Param("criterion", "select", "gini", "Split quality", options=["gini", "entropy", "log_loss"]),
              I("random_state", 42, "Seed of the tie-breaking"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        from sklearn.tree import DecisionTreeClassifier, export_text

        x, y, q = self.arrays(inputs)
        depth = int_param(params, "max_depth", 5)
        model = DecisionTreeClassifier(max_depth=depth if depth > 0 else None,
                                       criterion=str(params.get("criterion") or "gini"),
                                       random_state=int_param(params, "random_state", 42)).fit(x, y)
        return {"predictions": [str(p) for p in model.predict(q)],
                "feature_importances": self.tensor_of(model.feature_importances_),
                "tree_text": export_text(model), "classes": [str(c) for c in model.classes_]}


class LinearRegressionNode(SklearnNode):
    NODE_NAME, CATEGORY = "LinearRegression", "Classical"
    DESCRIPTION = "Ordinary least squares: predictions, coefficients and intercept"
    INPUTS = (T("x_train", "Training features [N, F]"), T("y_train", "Targets (N) or (N, K)"),
              T("x_query", "Features to predict [M, F]"))
    OUTPUTS = (T("predictions", "Predicted targets"), T("coef", "Coefficients"),
               Port("intercept", SCALAR, "Intercept (a number for one target)"))
    PARAMS = (B("fit_intercept", True, "Fit an intercept"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        from sklearn.linear_model import LinearRegression


        x, y, q = self.arrays(inputs, labels=False)
        model = LinearRegression(fit_intercept=as_bool(params.get("fit_intercept"), True)).fit(x, y)
        intercept = model.intercept_
        return {"predictions": self.tensor_of(model.predict(q)), "coef": self.tensor_of(model.coef_),
                "intercept": float(intercept) if getattr(intercept, "ndim", 0) == 0 else self.tensor_of(intercept)}


class LogisticRegressionNode(SklearnNode):
    NODE_NAME, CATEGORY = "LogisticRegression", "Classical"
    DESCRIPTION = "Logistic regression: predictions, class probabilities, classes and coefficients"
    INPUTS = _FIT_INPUTS
    OUTPUTS = (Port("predictions", LIST, "Predicted labels"), T("probabilities", "[M, C] probabilities"),
               Port("classes", LIST, "Class names"), T("coef", "[C, F] coefficients"))
    PARAMS = (F("C", 1.0, "Inverse regularisation strength"), I("max_iter", 200, "Most solver iterations", lo=1),
              Param("penalty", "select", "l2", "Regularisation", options=["l2", "l1", "none"]))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        from sklearn.linear_model import LogisticRegression

        x, y, q = self.arrays(inputs)
        penalty = str(params.get("penalty") or "l2")
        kwargs: dict[str, Any] = {"C": float_param(params, "C", 1.0), "max_iter": int_param(params, "max_iter", 200),
                                  "solver": "saga" if penalty == "l1" else "lbfgs"}
        if inspect.signature(LogisticRegression).parameters["penalty"].default == "deprecated":
            # scikit-learn >= 1.8 spells the penalty with l1_ratio and C.
            if penalty == "l1":
                kwargs["l1_ratio"] = 1.0
            elif penalty == "none":
                kwargs["C"] = float("inf")
        else:
            kwargs["penalty"] = None if penalty == "none" else penalty
        model = LogisticRegression(**kwargs).fit(x, y)
        return {"predictions": [str(p) for p in model.predict(q)],
                "probabilities": self.tensor_of(model.predict_proba(q)),
                "classes": [str(c) for c in model.classes_], "coef": self.tensor_of(model.coef_)}


class MLPClassifierNode(SklearnNode):
    NODE_NAME, CATEGORY = "MLPClassifier", "Classical"
    DESCRIPTION = "scikit-learn's multi-layer perceptron classifier (adam)"
    INPUTS = _FIT_INPUTS
    OUTPUTS = (Port("predictions", LIST, "Predicted labels"), T("probabilities", "[M, C] probabilities"),
               Port("classes", LIST, "Class names"), Port("train_loss", SCALAR, "Final training loss"))
    PARAMS = (Param("hidden_sizes", "string", "16,16", "Hidden layer sizes, comma-separated"),
              Param("activation", "select", "relu", "Activation", options=["relu", "tanh", "logistic", "identity"]),
              I("max_iter", 500, "Most epochs", lo=1), F("learning_rate_init", 0.01, "Learning rate", lo=0.0),
              I("seed", 42, "Seed"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        from sklearn.neural_network import MLPClassifier

        sizes = tuple(parse_int_list(params.get("hidden_sizes", "16,16"), "MLPClassifier: hidden_sizes"))
        # An empty list would be trained as something the user did not ask for: refused, as in CodefyUI.
        if not sizes or any(n < 1 for n in sizes):
            raise ValueError(f"MLPClassifier: hidden_sizes needs at least one layer of one or more units, "
                             f"got {params.get('hidden_sizes')!r}; write sizes such as '16,16'")
        x, y, q = self.arrays(inputs)
        model = MLPClassifier(hidden_layer_sizes=sizes, activation=str(params.get("activation") or "relu"),
                              solver="adam", max_iter=int_param(params, "max_iter", 500),
                              learning_rate_init=float_param(params, "learning_rate_init", 0.01),
                              random_state=int_param(params, "seed", 42)).fit(x, y)
        return {"predictions": [str(p) for p in model.predict(q)],
                "probabilities": self.tensor_of(model.predict_proba(q)),
                "classes": [str(c) for c in model.classes_], "train_loss": float(model.loss_)}


class RandomForestClassifierNode(SklearnNode):
    NODE_NAME, CATEGORY = "RandomForestClassifier", "Classical"
    DESCRIPTION = "A random forest of decision trees: predictions, probabilities and classes"
    INPUTS = _FIT_INPUTS
    OUTPUTS = (Port("predictions", LIST, "Predicted labels"), T("probabilities", "[M, C] probabilities"),
               Port("classes", LIST, "Class names"))
    PARAMS = (I("n_estimators", 100, "Trees", lo=1), I("max_depth", 0, "Deepest split; 0 for no limit", lo=0),
              I("seed", 0, "Seed"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        from sklearn.ensemble import RandomForestClassifier

        x, y, q = self.arrays(inputs)
        depth = int_param(params, "max_depth", 0)
        model = RandomForestClassifier(n_estimators=int_param(params, "n_estimators", 100),
                                       max_depth=depth if depth > 0 else None,
                                       random_state=int_param(params, "seed", 0)).fit(x, y)
        return {"predictions": [str(p) for p in model.predict(q)],
                "probabilities": self.tensor_of(model.predict_proba(q)), "classes": [str(c) for c in model.classes_]}


class SVMClassifierNode(SklearnNode):
    NODE_NAME, CATEGORY = "SVMClassifier", "Classical"
    DESCRIPTION = "A support vector classifier: predictions, support vectors and classes"
    INPUTS = _FIT_INPUTS
    OUTPUTS = (Port("predictions", LIST, "Predicted labels"), T("support_vectors", "The support vectors"),
               Port("classes", LIST, "Class names"))
    PARAMS = (F("C", 1.0, "Regularisation"),
              Param("kernel", "select", "rbf", "Kernel", options=["linear", "rbf", "poly", "sigmoid"]),
              Param("gamma", "string", "scale", "Kernel coefficient: scale, auto or a number"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        from sklearn.svm import SVC

        x, y, q = self.arrays(inputs)
        raw = str(params.get("gamma") or "scale").strip()
        try:
            gamma: Any = float(raw)
        except ValueError:
            gamma = raw
        model = SVC(C=float_param(params, "C", 1.0), kernel=str(params.get("kernel") or "rbf"), gamma=gamma).fit(x, y)
        return {"predictions": [str(p) for p in model.predict(q)],
                "support_vectors": self.tensor_of(model.support_vectors_), "classes": [str(c) for c in model.classes_]}


class SyntheticDatasetNode(SklearnNode):
    NODE_NAME, CATEGORY = "SyntheticDataset", "Data"
    DESCRIPTION = "A seeded 2-D toy dataset (circles, moons, blobs or classification) from scikit-learn"
    OUTPUTS = (T("tensor", "Points [N, 2]"), Port("labels", LIST, "Labels as strings"),
               Port("columns", LIST, "Column names"))
    PARAMS = (Param("kind", "select", "circles", "Shape of the data",
                    options=["circles", "moons", "blobs", "classification"]),
              I("n_samples", 200, "Points", lo=10), F("noise", 0.1, "Noise", lo=0.0),
              F("factor", 0.5, "Inner circle's scale (circles)", lo=0.0), I("centers", 3, "Clusters (blobs)", lo=2),
              I("seed", 42, "Seed"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        from sklearn import datasets

        kind = str(params.get("kind") or "circles")
        n, noise, seed = int_param(params, "n_samples", 200), float_param(params, "noise", 0.1), \
            int_param(params, "seed", 42)
        if kind == "circles":
            x, y = datasets.make_circles(n_samples=n, noise=noise,
                                         factor=max(0.01, min(0.99, float_param(params, "factor", 0.5))),
                                         random_state=seed)
        elif kind == "moons":
            x, y = datasets.make_moons(n_samples=n, noise=noise, random_state=seed)
        elif kind == "blobs":
            x, y = datasets.make_blobs(n_samples=n, centers=int_param(params, "centers", 3),
                                       cluster_std=max(0.1, noise * 5.0), random_state=seed)
        elif kind == "classification":
            x, y = datasets.make_classification(n_samples=n, n_features=2, n_redundant=0, n_informative=2,
                                                n_clusters_per_class=1, flip_y=noise, random_state=seed)
        else:
            raise ValueError(f"SyntheticDataset: unknown kind {kind!r}")
        return {"tensor": self.tensor_of(x), "labels": [str(int(v)) for v in y], "columns": ["x0", "x1"]}
