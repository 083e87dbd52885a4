"""The layer types a SequentialModel's ``layers`` graph can hold, as the canvas's layer editor
shows them: each type's ports and params (``GET /api/nodes`` answers them as ``layer_types``).

Plain data on purpose: the control plane answers this without importing torch.
``cdui/nodes/builtin/_torchlib/layer_spec.py`` builds the layers; ``tests/test_canvas_layers.py``
checks that this list names exactly the types it builds and that every param here is an argument
its constructor takes.
"""
from __future__ import annotations

from typing import Any

# (name, type, default); type "json" takes a number or a list (kernel_size 3 or [3, 3]).
# A default of REQUIRED means the layer cannot be built without it.
REQUIRED = object()
_NORM = [("eps", "float", 1e-05), ("momentum", "float", 0.1)]
_CONV = [("in_channels", "int", REQUIRED), ("out_channels", "int", REQUIRED), ("kernel_size", "json", REQUIRED),
         ("stride", "json", 1), ("padding", "json", 0), ("dilation", "json", 1), ("groups", "int", 1),
         ("bias", "bool", True)]
_RNN = [("input_size", "int", REQUIRED), ("hidden_size", "int", REQUIRED), ("num_layers", "int", 1),
        ("batch_first", "bool", False), ("bidirectional", "bool", False)]
_TRANSFORMER = [("d_model", "int", REQUIRED), ("nhead", "int", REQUIRED), ("num_layers", "int", 1),
                ("dim_feedforward", "int", 2048)]
_ACTIVATIONS = ["ELU", "GELU", "Hardswish", "LeakyReLU", "Mish", "PReLU", "ReLU", "SELU", "SiLU",
                "Sigmoid", "Softmax", "Tanh"]

_LAYERS: dict[str, tuple[str, str, list[tuple[str, str, Any]]]] = {
    "Linear": ("Dense", "A fully connected layer: out = x·Wᵀ + b.",
               [("in_features", "int", REQUIRED), ("out_features", "int", REQUIRED), ("bias", "bool", True)]),
    "Conv1d": ("Convolution", "A 1-d convolution over (N, C, L).", _CONV),
    "Conv2d": ("Convolution", "A 2-d convolution over (N, C, H, W).", _CONV),
    "ConvTranspose2d": ("Convolution", "A transposed 2-d convolution (upsampling).",
                        [*_CONV[:5], ("output_padding", "json", 0), ("groups", "int", 1), ("bias", "bool", True)]),
    "MaxPool2d": ("Pooling", "2-d max pooling.", [("kernel_size", "json", REQUIRED), ("stride", "json", None),
                                                 ("padding", "json", 0)]),
    "AvgPool2d": ("Pooling", "2-d average pooling.", [("kernel_size", "json", REQUIRED), ("stride", "json", None),
                                                     ("padding", "json", 0)]),
    "AdaptiveAvgPool2d": ("Pooling", "Average pooling to a fixed output size.",
                          [("output_size", "json", REQUIRED)]),
    "BatchNorm1d": ("Normalization", "Batch normalization over (N, C) or (N, C, L).",
                    [("num_features", "int", REQUIRED), *_NORM]),
    "BatchNorm2d": ("Normalization", "Batch normalization over (N, C, H, W).",
                    [("num_features", "int", REQUIRED), *_NORM]),
    "InstanceNorm2d": ("Normalization", "Instance normalization over (N, C, H, W).",
                       [("num_features", "int", REQUIRED), *_NORM]),
    "LayerNorm": ("Normalization", "Layer normalization over the last dimensions.",
                  [("normalized_shape", "json", REQUIRED), ("eps", "float", 1e-05)]),
    "GroupNorm": ("Normalization", "Group normalization.",
                  [("num_groups", "int", REQUIRED), ("num_channels", "int", REQUIRED), ("eps", "float", 1e-05)]),
    "Dropout": ("Regularization", "Zeroes each value with probability p while training.", [("p", "float", 0.5)]),
    "Flatten": ("Shape", "Flattens dimensions start_dim..end_dim into one.",
                [("start_dim", "int", 1), ("end_dim", "int", -1)]),
    "Reshape": ("Shape", 'Reshapes all but the batch dimension, e.g. shape "64,7,7".',
                [("shape", "string", REQUIRED)]),
    "SelectIndex": ("Shape", "Picks one index along a dimension (x.select(dim, index)).",
                    [("dim", "int", 1), ("index", "int", 0)]),
    "Identity": ("Shape", "Passes its input through.", []),
    "Embedding": ("Sequence", "A lookup table of num_embeddings vectors of size embedding_dim.",
                  [("num_embeddings", "int", REQUIRED), ("embedding_dim", "int", REQUIRED)]),
    "LSTM": ("Sequence", "An LSTM; answers its output sequence.", _RNN),
    "GRU": ("Sequence", "A GRU; answers its output sequence.", _RNN),
    "TransformerEncoder": ("Attention", "A stack of transformer encoder layers (batch first).", _TRANSFORMER),
    "TransformerDecoder": ("Attention", "A stack of transformer decoder layers attending to their input.",
                           _TRANSFORMER),
    "MultiHeadAttention": ("Attention", "Self-attention (batch first).",
                           [("embed_dim", "int", REQUIRED), ("num_heads", "int", REQUIRED)]),
}
MERGE_TYPES = {"Add": ("Merge", "Adds its inputs (same shape).", []),
               "Multiply": ("Merge", "Multiplies its inputs elementwise.", []),
               "Concat": ("Merge", "Concatenates its inputs along dim.", [("dim", "int", 1)])}
# Inputs of a merge layer: its incoming edges are its arguments in edge order.
MERGE_INPUTS = ["a", "b", "c", "d"]


# What each param means, shown under its field in the canvas's config panel and in the layer
# palette's tooltips. The same name means the same thing in every layer that takes it, except where
# _PARAM_TEXT_FOR names a layer.
_PARAM_TEXT = {
    "in_features": "Size of each input sample: the input's last dimension.",
    "out_features": "Size of each output sample: the number of units this layer gives.",
    "bias": "Learn an additive bias as well as the weights.",
    "in_channels": "Channels of the input (dimension 1: 1 for greyscale images, 3 for RGB).",
    "out_channels": "Channels the layer produces: the number of filters it learns.",
    "kernel_size": "Size of the sliding window: one number (3) or one per dimension ([3, 3]).",
    "stride": "Step of the window between positions: one number or one per dimension.",
    "padding": "Zeros added on each side of the input before the window slides: one number or one per dimension.",
    "dilation": "Spacing between the window's elements (1: a plain window).",
    "groups": "Blocked connections from input to output channels (both must divide by it; 1: every input "
              "channel feeds every output channel).",
    "output_padding": "Extra size added to one side of the output, to reach an exact output shape.",
    "output_size": "Height and width of the output: one number (square) or [h, w].",
    "num_features": "Channels of the input (dimension 1) that are normalized, each with its own statistics.",
    "eps": "A small number added to the variance so it is never divided by zero.",
    "momentum": "How fast the running mean and variance follow each batch (0.1: 10% of the new batch).",
    "normalized_shape": "The trailing dimensions normalized together: one number (the last dimension's size) "
                        "or a list.",
    "num_groups": "Groups the channels are split into; each group is normalized on its own.",
    "num_channels": "Channels of the input; must divide by num_groups.",
    "p": "Probability that a value is zeroed while training (0 to 1).",
    "start_dim": "First dimension flattened (1 keeps the batch dimension).",
    "end_dim": "Last dimension flattened (-1: the last one).",
    "shape": 'The new shape of everything but the batch dimension, as numbers separated by commas, e.g. "64,7,7".',
    "dim": "The dimension the layer works along (0 is the batch).",
    "index": "Which position along dim is kept.",
    "num_embeddings": "Size of the vocabulary: input values must be whole numbers from 0 to this minus 1.",
    "embedding_dim": "Length of the vector each input value becomes.",
    "input_size": "Features of each step of the input sequence.",
    "hidden_size": "Features of the hidden state, and of each step of the output.",
    "num_layers": "Layers stacked, each feeding the next.",
    "batch_first": "The input is (batch, sequence, features) rather than (sequence, batch, features).",
    "bidirectional": "Also read the sequence backwards; the output's features double.",
    "d_model": "Features of each token (the input's last dimension).",
    "nhead": "Attention heads; d_model must divide by it.",
    "dim_feedforward": "Width of the feed-forward network inside each layer.",
    "embed_dim": "Features of each token (the input's last dimension).",
    "num_heads": "Attention heads; embed_dim must divide by it.",
}
_PARAM_TEXT_FOR = {
    ("Concat", "dim"): "The dimension the inputs are joined along (1: features or channels).",
    ("SelectIndex", "dim"): "The dimension one position is picked from (0 is the batch).",
    ("MaxPool2d", "stride"): "Step of the window between positions (empty: the kernel size).",
    ("AvgPool2d", "stride"): "Step of the window between positions (empty: the kernel size).",
    ("GroupNorm", "num_channels"): "Channels of the input; must divide by num_groups.",
    ("TransformerDecoder", "num_layers"): "Decoder layers stacked, each attending to the layer's input.",
    ("TransformerEncoder", "num_layers"): "Encoder layers stacked, each feeding the next.",
}
_PORT_TEXT = {"x": "The tensor this layer takes.", "y": "The tensor this layer gives."}


def describe(layer: str, name: str) -> str:
    """What param ``name`` of layer type ``layer`` means ("" for a name nothing describes)."""
    return _PARAM_TEXT_FOR.get((layer, name)) or _PARAM_TEXT.get(name, "")


def _param(name: str, kind: str, default: Any, layer: str = "") -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "type": kind, "default": None if default is REQUIRED else default,
                         "description": describe(layer, name)}
    if default is REQUIRED:
        d["required"] = True
    return d


def _port(name: str, optional: bool = False, description: str = "") -> dict[str, Any]:
    return {"name": name, "type": "TENSOR", "optional": optional,
            "description": description or _PORT_TEXT.get(name, "")}


def layer_types() -> list[dict[str, Any]]:
    """Every layer type, in the catalog's shape: {type, category, description, inputs, outputs, params}."""
    out: list[dict[str, Any]] = [
        {"type": "Input", "category": "Graph", "description": "The model's input tensor (exactly one).",
         "inputs": [], "outputs": [_port("x", description="The tensor the model is called with.")], "params": []},
        {"type": "Output", "category": "Graph", "description": "The model's output (exactly one): its first input.",
         "inputs": [_port("y", description="The tensor the model answers.")], "outputs": [], "params": []},
    ]
    for name, (cat, desc, params) in sorted(_LAYERS.items()):
        out.append({"type": name, "category": cat, "description": desc, "inputs": [_port("x")],
                    "outputs": [_port("y")], "params": [_param(*p, layer=name) for p in params]})
    for name, (cat, desc, params) in sorted(MERGE_TYPES.items()):
        out.append({"type": name, "category": cat, "description": desc,
                    "inputs": [_port(n, optional=i > 1, description=f"Input {i + 1} (in edge order)")
                               for i, n in enumerate(MERGE_INPUTS)],
                    "outputs": [_port("y")], "params": [_param(*p, layer=name) for p in params]})
    for name in _ACTIVATIONS:
        out.append({"type": name, "category": "Activation", "description": f"The {name} activation.",
                    "inputs": [_port("x")], "outputs": [_port("y")], "params": []})
    return out
