"""ResNet-18 from torchvision (random weights), the standard CNN workload.

    tilecc run examples/resnet.py:resnet18 --target edge       # 1x3x64x64
    tilecc run examples/resnet.py:resnet18_32 --target tiny    # 1x3x32x32, faster

Convolutions lower to implicit GEMM on the systolic array; each batch norm (folded into
per-channel scale and shift at import) and the ReLU / residual add after it run in the
convolution's epilogue. Weights are random (`weights=None`): nothing is downloaded.
"""

import sys
import types

import torch


def _torchvision():
    # PyPI's torchvision wheel is a CUDA build: skip its C++ op registrations
    for m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(m, types.ModuleType(m))
    import torchvision

    return torchvision


def _randomise_batch_norm(model: torch.nn.Module) -> None:
    """Non-trivial running statistics and affine parameters (a fresh model has mean 0,
    var 1, weight 1, bias 0, which would hide batch-norm mistakes)."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(0.1 * torch.randn(c, generator=g))
            m.running_var.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
            m.weight.data.copy_(1.0 + 0.1 * torch.randn(c, generator=g))
            m.bias.data.copy_(0.1 * torch.randn(c, generator=g))


def make_resnet18(resolution: int = 64, batch: int = 1):
    torch.manual_seed(0)
    model = _torchvision().models.resnet18(weights=None).eval()
    with torch.no_grad():
        _randomise_batch_norm(model)
    return model, (torch.randn(batch, 3, resolution, resolution),)


def resnet18():
    """ResNet-18, 1x3x64x64."""
    return make_resnet18(64)


def resnet18_32():
    """ResNet-18, 1x3x32x32 (the spatial size is 1x1 from layer4 on)."""
    return make_resnet18(32)
