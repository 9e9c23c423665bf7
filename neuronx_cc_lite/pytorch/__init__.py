"""The PyTorch front door (the `[torch]` extra): torch modules to bundles through torch.onnx's exporter.

    traced = neuronx_cc_lite.trace(model, (x,))           # ahead of time, for these shapes (traced.py)
    import neuronx_cc_lite.torch_backend                   # registers the torch.compile backend (dynamo.py)
    compiled = torch.compile(model, backend="neuronx_cc_lite")

Both export with export.py and run the bundle on the simulated chip with chip.py. This package imports torch;
`import neuronx_cc_lite` does not, and reaches it only when `trace` or `load_traced` is called.
"""

from neuronx_cc_lite.pytorch.dynamo import backend
from neuronx_cc_lite.pytorch.traced import TracedModule, load_traced, trace

__all__ = ["trace", "load_traced", "TracedModule", "backend"]
