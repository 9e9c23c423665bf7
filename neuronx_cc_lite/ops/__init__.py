"""What the compiler knows of ONNX ops apart from how it lowers them (ops/traits.py)."""
