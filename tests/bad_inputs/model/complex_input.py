import torch

ERROR = "UnsupportedOpError"
EXPECT = ("2 unsupported op(s) (aten.view_as_real.default, input 'x'): input 'x' (dtype torch.complex64; "
          "tilecc takes float32, bfloat16, float16, integer and bool tensors) at <input>; "
          "aten.view_as_real.default at complex_input.py:{line:view_as_real}")


class M(torch.nn.Module):
    def forward(self, x):
        return torch.view_as_real(x)  # view_as_real


def factory():
    return M(), (torch.randn(3, 4, dtype=torch.complex64),)
