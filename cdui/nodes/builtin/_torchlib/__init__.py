"""torch-backed helpers of the built-in nodes (modules, datasets).

This package's ``__init__`` stays empty on purpose: the node registry imports
every entry of :mod:`cdui.nodes.builtin` at server start, and importing torch
there would cost seconds for a process that never runs a node. The modules
inside import torch at their top and are imported only from ``execute``.
Classes live at module scope so ``torch.save`` of a whole model can name them.
"""
