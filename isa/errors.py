"""Errors of the instruction set and bundle format. Each carries a stable code, printed first on its one line."""

from __future__ import annotations


class IsaError(Exception):
    code = "NCC_ISA"

    def __str__(self) -> str:
        return f"{self.code}: {super().__str__()}"


class BundleError(IsaError):
    """A bundle file or archive that is truncated, corrupted, foreign, or breaks the format's schema or limits."""

    code = "NCC_BUNDLE"
