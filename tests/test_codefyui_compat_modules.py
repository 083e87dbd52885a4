"""Modules of CodefyUI's backend that its official packs import besides the node API
(cdui/nodes/codefyui_compat.py): the deep pack's Edu-ResBlock builds CodefyUI's diffusion residual block,
`app.nodes.diffusion._resblock_module._ResBlockModule`. And the message for a node of an installed pack that
is not there (one of its files failed to load), which said the pack was not installed."""
from __future__ import annotations

import importlib
import math

import torch
from torch.nn import functional

from cdui.graph.validate import unknown_type_error
from cdui.nodes import codefyui_compat


def resblock() -> type:
    codefyui_compat.install_modules()
    module = importlib.import_module("app.nodes.diffusion._resblock_module")
    cls: type = module._ResBlockModule
    return cls


def test_the_resblock_draws_its_weights_from_its_seed_in_codefyuis_order() -> None:
    block = resblock()(in_channels=4, out_channels=8, groups=2, time_emb_dim=6, seed=7)
    gen = torch.Generator()
    gen.manual_seed(7)
    std = 1.0 / math.sqrt(4)
    for layer in (block.conv1, block.conv2, block.time_proj, block.skip):  # skip: a 1x1 conv, 4 -> 8 channels
        assert torch.equal(layer.weight, torch.randn(layer.weight.shape, generator=gen) * std)
        assert torch.count_nonzero(layer.bias) == 0
    again = resblock()(in_channels=4, out_channels=8, groups=2, time_emb_dim=6, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(block.state_dict().values(), again.state_dict().values(),
                                                 strict=True))
    # The same channels in and out: no skip conv, the input is added as it is; no projection without time_emb_dim.
    plain = resblock()(in_channels=4, out_channels=4, groups=2, time_emb_dim=0, seed=1)
    assert isinstance(plain.skip, torch.nn.Identity) and plain.time_proj is None


def test_the_resblock_computes_norm_silu_conv_time_bias_and_the_skip() -> None:
    block = resblock()(in_channels=4, out_channels=8, groups=2, time_emb_dim=6, seed=3)
    x, t = torch.randn(2, 4, 5, 5), torch.randn(2, 6)
    h = functional.conv2d(functional.silu(functional.group_norm(x, 2, block.norm1.weight, block.norm1.bias)),
                          block.conv1.weight, block.conv1.bias, padding=1)
    h = h + (t @ block.time_proj.weight.T + block.time_proj.bias)[:, :, None, None]
    h = functional.conv2d(functional.silu(functional.group_norm(h, 2, block.norm2.weight, block.norm2.bias)),
                          block.conv2.weight, block.conv2.bias, padding=1)
    expected = h + functional.conv2d(x, block.skip.weight, block.skip.bias)
    with torch.no_grad():
        assert torch.allclose(block(x, t), expected, atol=1e-5)
        assert block(x).shape == (2, 8, 5, 5)  # without a time embedding, no bias is added
        assert not torch.allclose(block(x), block(x, t))


def test_a_missing_node_of_an_installed_pack_is_not_called_a_missing_pack() -> None:
    known = ["deep:Edu-Conv2d", "deep:Edu-Resample", "Print"]
    e = unknown_type_error("rb", "deep:Edu-ResBlock", known)
    assert "the plugin pack 'deep' is installed but has no node of that name here" in e["message"], e
    assert "load errors" in e["hint"]
    e = unknown_type_error("rb", "rl:Edu-GRPO", known)
    assert "a node of the plugin pack 'rl', which is not installed" in e["message"], e
    assert "cdui plugin install rl" in e["hint"]


def test_an_execution_context_is_built_by_keyword_as_codefyuis_dataclass_is() -> None:
    # CodefyUI's packs' own tests (the deep pack's attention tests) build one as
    # ExecutionContext(device="cpu") and hand it to a node; it used to take only cdui's run context, and the
    # call failed with "unexpected keyword argument 'device'".
    codefyui_compat.install_modules()
    ec_mod = importlib.import_module("app.core.execution_context")
    base = importlib.import_module("app.core.node_base")
    stateful = importlib.import_module("app.core.stateful_module")

    class Scale(stateful.StatefulModuleMixin, base.BaseNode):
        NODE_NAME = "Scale"
        structural_params = ("width",)

        @classmethod
        def define_inputs(cls):  # type: ignore[no-untyped-def]
            return []

        @classmethod
        def define_outputs(cls):  # type: ignore[no-untyped-def]
            return []

        def build_module(self, params):  # type: ignore[no-untyped-def]
            return torch.nn.Linear(int(params["width"]), 1)

        def execute(self, inputs, params, progress_callback=None, *, context=None):  # type: ignore[no-untyped-def]
            module = self.get_or_build_module(context, params)
            return {"device": str(next(module.parameters()).device), "verbose": context.verbose,
                    "seed": context.derive_seed("n1"), "stop": context.should_stop()}

    ctx = ec_mod.ExecutionContext(device="cpu", verbose=True, seed=5, current_node_id="n1")
    assert Scale().execute({}, {"width": 3}, context=ctx) == {
        "device": "cpu", "verbose": True, "seed": codefyui_compat.derive_seed(5, "n1"), "stop": False}
    assert ctx.run_context is None and ctx.weights_persistent is True and ctx.graph_id == ""
    ctx.cancel()
    assert ctx.should_stop() and ctx.cancelled
    gen = ctx.make_generator("n1")
    assert torch.equal(torch.rand(3, generator=gen),
                       torch.rand(3, generator=torch.Generator().manual_seed(codefyui_compat.derive_seed(5, "n1"))))
    # CodefyUI's defaults: cpu, not verbose, unseeded (derive_seed and make_generator give None).
    plain = ec_mod.ExecutionContext()
    assert (plain.device, plain.verbose, plain.derive_seed("x"), plain.make_generator("x")) == (
        "cpu", False, None, None)
    plain.log_warning("kind", "a warning with no run to report to goes to the log")
