"""What every build script of models/ shares: writing the models it builds next to it."""

from __future__ import annotations

import os

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))


def save(models: dict[str, onnx.ModelProto]) -> None:
    for name, model in models.items():
        path = os.path.join(HERE, f"{name}.onnx")
        onnx.save(model, path)
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")
