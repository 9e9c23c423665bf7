"""Compiler errors: a stable code, the ONNX node or tensor concerned, and the cause, on one line."""

from __future__ import annotations


class CompileError(Exception):
    def __init__(self, code: str, message: str, node: str | None = None, op: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.node = node
        self.op = op

    def __str__(self) -> str:
        where = ""
        if self.node is not None:
            where = f"node {self.node!r}" + (f" ({self.op})" if self.op else "") + ": "
        return f"{self.code}: {where}{self.message}"


class UnsupportedError(CompileError):
    """One or more nodes the compiler cannot lower; `nodes` holds (name, op, reason) for each."""

    def __init__(self, nodes: list[tuple[str, str, str]], message: str | None = None, code: str = "NCC_UNSUPPORTED",
                 node: str | None = None, op: str | None = None) -> None:
        self.nodes = nodes
        listed = "; ".join(f"{name!r} ({op}): {reason}" for name, op, reason in nodes)
        super().__init__(code, message or f"{len(nodes)} unsupported node(s): {listed}", node, op)
