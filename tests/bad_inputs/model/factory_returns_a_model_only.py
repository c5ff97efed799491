import torch

ERROR = "ModelLoadError"
EXPECT = "{spec}() must return (model, example_inputs)"


def factory():
    return torch.nn.ReLU()
