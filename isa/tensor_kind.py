"""The kinds of tensor a program keeps in HBM: one enum for the compiler that makes them, the bundle that records
them and the profiler that counts them, so that no one of them can spell a kind the others do not know. Its values
are the strings a bundle's manifest and a listing carry, unchanged."""

from __future__ import annotations

import enum


class TensorKind(str, enum.Enum):
    INPUT = "input"  # a model input: the host writes it before a run
    OUTPUT = "output"  # a model output: the host reads it after a run
    STATE = "state"  # device state: read and written in place, kept in HBM from one run to the next
    WEIGHT = "weight"  # a constant, placed in HBM at load
    SCRATCH = "scratch"  # a result between operators, which only the program reads

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: str) -> TensorKind:
        """The kind a bundle or listing names; ValueError naming `text` when there is no such kind."""
        try:
            return cls(text)
        except ValueError:
            known = ", ".join(k.value for k in cls)
            raise ValueError(f"unknown HBM tensor kind {text!r} (known: {known})") from None
