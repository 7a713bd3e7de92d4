"""torchvision's detection models, which TorchDynamo compiles with graph breaks (data-dependent
shapes, Python lists of boxes): compiled with graph breaks, their outputs equal eager's, and a
second identical call compiles nothing new.

Graph counts are compared with TorchDynamo's on the same model and input (torch 2.15.0, measured
with `torch._dynamo.explain`; TorchDynamo takes minutes on these, so its counts are recorded
here): within ±20% for each. maskrcnn's `paste_mask_in_image` takes `max(box[0], 0)` /
`min(box[2] + 1, im_w)` of 0-d tensors once per detection; these are graph operations (clamp /
where), not breaks, as under TorchDynamo; its slice with those tensors as bounds breaks the graph
at the indexing, after the bounds' arithmetic (40 graphs, as TorchDynamo's)."""

from __future__ import annotations

import pytest
import torch
import torchvision

import dynamo_rs
from dynamo_rs.testing import CompileCounter

# Graphs TorchDynamo makes for each model on one 3×160×160 image in eval mode.
TORCHDYNAMO_GRAPHS = {
    "fasterrcnn_mobilenet_v3_large_320_fpn": 18,
    "ssdlite320_mobilenet_v3_large": 7,
    "retinanet_resnet50_fpn": 5,
    "maskrcnn_resnet50_fpn": 40,
}

MODELS = [
    "fasterrcnn_mobilenet_v3_large_320_fpn",
    "ssdlite320_mobilenet_v3_large",
    "retinanet_resnet50_fpn",
    "maskrcnn_resnet50_fpn",
]


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


def _values(outputs):
    return [value for detections in outputs for value in detections.values()]


@pytest.mark.parametrize("name", MODELS)
def test_detection_model_with_graph_breaks(name) -> None:
    torch.manual_seed(0)
    model = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None).eval()
    images = [torch.rand(3, 160, 160)]
    counter = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=counter)
    with torch.no_grad():
        expected = model(images)
        actual = compiled(images)
        graphs = counter.frame_count
        again = compiled(images)
    assert graphs > 1, "split into several graphs"
    assert counter.frame_count == graphs, "an identical call compiled again"
    for result in (actual, again):
        assert len(result) == len(expected)
        for e, a in zip(_values(expected), _values(result)):
            torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
    theirs = TORCHDYNAMO_GRAPHS[name]
    assert abs(graphs - theirs) <= 0.2 * theirs, (graphs, theirs)
