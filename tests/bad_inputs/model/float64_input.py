import torch

ERROR = "UnsupportedOpError"
EXPECT = ("1 unsupported op(s) (input 'x'): input 'x' (dtype torch.float64; tilecc takes float32, bfloat16, "
          "float16, integer and bool tensors) at <input>")


class M(torch.nn.Module):
    def forward(self, x):
        return x * 2


def factory():
    return M(), (torch.randn(3, 4, dtype=torch.float64),)
