import torch

ERROR = "TensorTooLargeError"
EXPECT = ("graph.layer_norm at ln (LayerNorm) @ layernorm_row_too_large.py:{line:layer_norm}: a row of 65536 elements does not "
          "fit one SRAM partition (65536 bytes) with its working buffers")


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(1 << 16)

    def forward(self, x):
        return self.ln(x)  # layer_norm


def factory():
    return M(), (torch.randn(2, 1 << 16),)
