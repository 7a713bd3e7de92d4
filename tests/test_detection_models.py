"""torchvision's detection models, which TorchDynamo compiles with graph breaks (data-dependent
shapes, Python lists of boxes): compiled with graph breaks, their outputs equal eager's, and a
second identical call compiles nothing new.

Graph counts are not at TorchDynamo's yet (it traces `OrderedDict()`, list appends, dict stores
and `zip` that we break at, and inlines the modules of frames we split, which we compile one
by one): fasterrcnn_mobilenet_v3_large_320_fpn 39 vs 18, ssdlite 11 vs 7, retinanet 23 vs 5,
maskrcnn 99 vs 40 (measured with 160×160 inputs)."""

from __future__ import annotations

import pytest
import torch
import torchvision

import dynamo_rs
from dynamo_rs.testing import CompileCounter

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
    assert compiled._dynamo_rs_converter.breaks
    for result in (actual, again):
        assert len(result) == len(expected)
        for e, a in zip(_values(expected), _values(result)):
            torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
