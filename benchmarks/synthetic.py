"""Synthetic models for the scaling and per-call benchmarks."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mlp(layers: int, width: int = 64) -> torch.nn.Module:
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks).eval()


class Block(torch.nn.Module):
    """A small pre-norm transformer block: attention through scaled_dot_product_attention."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, 2 * dim)
        self.fc2 = torch.nn.Linear(2 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def transformer(layers: int) -> torch.nn.Module:
    return torch.nn.Sequential(*[Block() for _ in range(layers)]).eval()


# --- graph-break examples (the seed articles' kinds of break) -----------------------------------


class DataDependentBranch(torch.nn.Module):
    """Branches on a tensor's value: `.item()` needs the data, so the graph breaks there."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = mlp(4)
        self.decoder = mlp(4)

    def forward(self, x):
        h = self.encoder(x)
        if h.sum().item() > 0:
            h = h * 2
        return self.decoder(h)


class PrintInForward(torch.nn.Module):
    """Logs from the middle of forward: a side effect that cannot go into a graph."""

    def __init__(self) -> None:
        super().__init__()
        self.first = mlp(4)
        self.second = mlp(4)
        self.lines: list[str] = []

    def forward(self, x):
        h = self.first(x)
        self.lines.append(f"mean {float(h.mean()):.3f}")
        return self.second(h)


def graph_break_examples() -> dict:
    """name -> (model, inputs) for models TorchDynamo captures in several graphs."""
    torch.manual_seed(0)
    return {
        "break: .item() branch": (DataDependentBranch().eval(), (torch.randn(8, 64),)),
        "break: logging in forward": (PrintInForward().eval(), (torch.randn(8, 64),)),
    }


DETECTION_MODELS = [
    "fasterrcnn_mobilenet_v3_large_320_fpn",
    "ssdlite320_mobilenet_v3_large",
    "retinanet_resnet50_fpn",
    "maskrcnn_resnet50_fpn",
]


def detection_examples() -> dict:
    """name -> (model, inputs): torchvision's detection models (random weights, eval), which
    both front ends compile with graph breaks (data-dependent shapes, lists of boxes). Built
    when first asked for: each takes seconds."""
    import torchvision

    examples = {}
    for name in DETECTION_MODELS:
        torch.manual_seed(0)
        model = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None).eval()
        examples[f"break: {name}"] = (model, ([torch.rand(3, 160, 160)],))
    return examples
