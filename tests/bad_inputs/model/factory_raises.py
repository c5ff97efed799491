ERROR = "ModelLoadError"
EXPECT = "{spec}() raised RuntimeError: weights file not found"


def factory():
    raise RuntimeError("weights file not found")
