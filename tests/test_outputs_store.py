"""The recorded-outputs store (cdui/run/outputs.py) as the run subprocess writes it: summaries, the
PNG thumbnail, the size bound with the oldest runs dropped first, and what is read back.
In-process: a real folder and real tensors, no run subprocess."""
from __future__ import annotations

import base64
import json
import math
import os
import struct
import zlib
from pathlib import Path

import pytest
import torch

from cdui.run import outputs
from cdui.wire import node_outputs

MiB = 1024 * 1024


def _png_pixels(b64: str) -> tuple[int, int, int, bytes]:
    """(width, height, PNG colour type, pixels) of one of our PNGs, decoded by hand."""
    data = base64.b64decode(b64)
    assert data[:8] == node_outputs.PNG_MAGIC
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    assert depth == 8
    idat = data[data.index(b"IDAT") + 4:data.index(b"IEND") - 8]
    raw = zlib.decompress(idat)
    stride = width * {0: 1, 2: 3, 6: 4}[color]
    rows = [raw[y * (stride + 1):(y + 1) * (stride + 1)] for y in range(height)]
    assert all(r[0] == 0 for r in rows)  # filter "none" on every row
    return width, height, color, b"".join(r[1:] for r in rows)


def test_summaries_of_each_kind_of_output():
    assert outputs.summarize("x", torch.tensor([1.0, float("nan"), 3.0, float("inf")])) == {
        "port": "x", "kind": "tensor", "shape": [4], "dtype": "float32", "min": 1.0, "max": 3.0, "mean": 2.0,
        "nonfinite": 2, "preview": [[1.0, None, 3.0, None]]}
    assert outputs.summarize("b", torch.tensor([True, False, True, True])) == {
        "port": "b", "kind": "tensor", "shape": [4], "dtype": "bool", "min": 0.0, "max": 1.0, "mean": 0.75,
        "preview": [[1.0, 0.0, 1.0, 1.0]]}
    assert outputs.summarize("e", torch.zeros(0, 3)) == {"port": "e", "kind": "tensor", "shape": [0, 3],
                                                         "dtype": "float32"}
    assert outputs.summarize("m", torch.nn.Linear(3, 2)) == {"port": "m", "kind": "model",
                                                             "note": "Linear, 8 parameters"}
    assert outputs.summarize("n", 2.5) == {"port": "n", "kind": "number", "note": "2.5", "min": 2.5, "max": 2.5,
                                           "mean": 2.5}
    assert outputs.summarize("s", "y" * 600) == {"port": "s", "kind": "text", "note": "y" * 500}
    assert outputs.summarize("l", [1, 2]) == {"port": "l", "kind": "list", "note": "list of 2 items"}
    # A 2-D matrix is not an image: no thumbnail.
    assert "thumbnail" not in outputs.summarize("w", torch.rand(64, 64))


def test_the_values_preview_is_the_same_block_for_tensors_of_one_shape():
    """The Inspector colours the difference of two previews: they must hold the same elements."""
    t = torch.arange(2 * 3 * 20 * 20, dtype=torch.float32).reshape(2, 3, 20, 20)
    p = outputs.summarize("t", t)["preview"]
    assert len(p) == 16 and all(len(row) == 16 for row in p)
    assert p[0][:3] == [0.0, 1.0, 2.0] and p[1][0] == 20.0 and p[15][15] == 15 * 20 + 15
    assert outputs.summarize("t", t * 2)["preview"][15][15] == 2 * p[15][15]
    assert outputs.summarize("s", torch.tensor(7.5))["preview"] == [[7.5]]
    assert outputs.summarize("v", torch.arange(40.0))["preview"] == [[float(i) for i in range(16)]]
    assert "preview" not in outputs.summarize("c", torch.zeros(2, dtype=torch.complex64))


def test_an_image_gets_a_thumbnail_scaled_from_its_own_range():
    img = torch.zeros(2, 3, 4, 6)
    img[0, 0] = 1.0       # the first image of the batch: red
    img[0, 2, :, 3:] = 0.5  # the right half also half blue
    w, h, color, px = _png_pixels(outputs.summarize("image", img)["thumbnail"])
    assert (w, h, color) == (6, 4, 2)
    assert px[:3] == bytes([255, 0, 0]) and px[3 * 3:3 * 4] == bytes([255, 0, 128])
    # The longer side is brought to at most 64 px by keeping every n-th pixel.
    w, h, color, _ = _png_pixels(outputs.summarize("big", torch.rand(1, 300, 130))["thumbnail"])
    assert (w, h, color) == (26, 60, 0)


def _record(root: Path, run_id: str, nodes: dict[str, torch.Tensor], max_bytes: int) -> list[str]:
    warnings: list[str] = []
    rec = outputs.Recorder(root, run_id, max_bytes, warnings.append)
    for nid, t in nodes.items():
        rec.node(nid, "TensorCreate", {"tensor": t})
    rec.close(60)
    return warnings


def test_the_oldest_runs_captures_are_dropped_first(tmp_path):
    root = tmp_path / "outputs"
    quarter = torch.zeros(MiB // 16)  # 256 KiB of float32
    for i, rid in enumerate(("r1", "r2", "r3")):
        assert _record(root, rid, {"a": quarter}, 1 * MiB) == []
        os.utime(root / rid, (1000 + i, 1000 + i))  # r1 oldest
    # r4 needs 512 KiB more: r1 and r2 go, the newest kept run stays.
    assert _record(root, "r4", {"a": quarter, "b": quarter}, 1 * MiB) == []
    assert sorted(p.name for p in root.iterdir()) == ["r3", "r4"]
    assert outputs.list_nodes(root, "r4") == [{"node_id": "a", "type": "TensorCreate"},
                                              {"node_id": "b", "type": "TensorCreate"}]
    assert torch.equal(torch.load(root / "r4" / f"{outputs.node_file('b')}.0.pt"), quarter)
    assert outputs.list_nodes(root, "r1") is None


def test_a_run_over_the_bound_alone_keeps_summaries_without_raw_tensors(tmp_path):
    root = tmp_path / "outputs"
    assert _record(root, "big", {"a": torch.ones(MiB // 2), "b": torch.ones(3)}, 1 * MiB) == []
    index = json.loads((root / "big" / "index.json").read_text())
    assert [(n["node_id"], n["raw"]) for n in index["nodes"]] == [("a", []), ("b", [0])]
    assert outputs.read_node(root, "big", "a")["outputs"][0]["shape"] == [MiB // 2]


def test_what_is_read_back_is_only_ours(tmp_path):
    root = tmp_path / "outputs"
    _record(root, "r1", {"../../etc": torch.ones(2)}, MiB)
    assert outputs.read_node(root, "r1", "../../etc")["node_id"] == "../../etc"
    # Files are named by the node id's hash: the id is never a path.
    assert sorted(p.name for p in (root / "r1").iterdir()) == sorted(
        ["index.json", f"{outputs.node_file('../../etc')}.json", f"{outputs.node_file('../../etc')}.0.pt"])
    for bad in ("..", "../r1", "/etc", "r1/..", "", "a" * 65):
        assert outputs.list_nodes(root, bad) is None and outputs.read_node(root, bad, "x") is None
    assert outputs.read_node(root, "r1", "other") is None


@pytest.mark.parametrize("change, error", [
    ({"shape": [1] * 17}, "a shape must be at most 16 sizes"),
    ({"shape": [-1]}, "a shape must be at most 16 sizes"),
    ({"thumbnail": base64.b64encode(b"GIF89a").decode()}, "a thumbnail must be a PNG"),
    ({"thumbnail": "not base64!"}, "a thumbnail must be base64"),
    ({"min": math.inf}, "min must be a finite number"),
    ({"dtype": "d" * 33}, "a text of 33 characters is over the limit of 32"),
    ({"nonfinite": True}, "nonfinite must be a count"),
    ({"preview": [[0.0] * 17]}, "a preview must be at most 16 rows of at most 16 values"),
    ({"preview": [[0.0]] * 17}, "a preview must be at most 16 rows of at most 16 values"),
    ({"preview": [["1"]]}, "a preview holds finite numbers or null"),
    ({"preview": [[math.nan]]}, "a preview holds finite numbers or null"),
])
def test_a_workers_summary_is_rebuilt_or_refused(change, error):
    good = {"node_id": "n", "type": "T", "outputs": [{"port": "p", "kind": "tensor", "shape": [2], "min": 1}],
            "path": "/etc/passwd"}
    assert node_outputs.clean_summary(good, "n") == {"node_id": "n", "type": "T", "outputs": [
        {"port": "p", "kind": "tensor", "shape": [2], "min": 1.0}]}
    bad = json.loads(json.dumps(good))
    bad["outputs"][0].update(change)
    with pytest.raises(ValueError, match=error):
        node_outputs.clean_summary(bad, "n")
    with pytest.raises(ValueError, match="another node"):
        node_outputs.clean_summary(good, "m")
