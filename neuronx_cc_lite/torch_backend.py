"""Importing this module registers the torch.compile backend "neuronx_cc_lite" (neuronx_cc_lite/pytorch/dynamo.py):

    import neuronx_cc_lite.torch_backend  # noqa: F401
    compiled = torch.compile(model, backend="neuronx_cc_lite", options={"auto_cast": "matmult"})

Registering is this module's only purpose, so it does it on import, as torch's own backend modules do.
"""

from torch._dynamo import register_backend

from neuronx_cc_lite.pytorch.dynamo import backend

NAME = "neuronx_cc_lite"

try:
    register_backend(backend, name=NAME)
except AssertionError:  # torch's answer to a second registration: the package's entry point has loaded it already
    pass
