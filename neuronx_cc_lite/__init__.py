"""neuronx-cc-lite: an ahead-of-time compiler from ONNX models to bundles for a simulated NeuronCore chip."""

__version__ = "0.1.0"


def compile(model, options=None):  # type: ignore[no-untyped-def]  # noqa: A001 - the public name users expect
    """Compile an ONNX model (a path or a ModelProto) to a `isa.bundle.Bundle`."""
    from neuronx_cc_lite.compiler import compile_model

    return compile_model(model, options)
