import torch

ERROR = "TensorTooLargeError"
EXPECT = ("graph.softmax at softmax_row_too_large.py:{line:softmax}: a row of 262144 elements does not fit "
          "one SRAM partition (65536 bytes) with its working buffers")


class M(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)  # softmax


def factory():
    return M(), (torch.randn(2, 1 << 18),)
