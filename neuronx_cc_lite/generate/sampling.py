"""Choosing the next token from a step's logits, on the host, as transformers' generate does.

    greedy   the largest logit (the first of equal ones, as numpy's and ONNX's ArgMax take)
    top-k    softmax(logits / temperature) over the k largest logits, renormalised, then one draw
    top-p    softmax(logits / temperature); the fewest most probable tokens whose probabilities sum to p or more
             (nucleus sampling), renormalised, then one draw

Draws come from one numpy Generator seeded once per generation (`Sampler(seed=...)`), so a seed gives the same
tokens every time; ties in probability are broken by token id (a stable sort), so the choice does not depend on
numpy's sort algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MODES = ("greedy", "top-k", "top-p")


@dataclass
class Sampler:
    mode: str = "greedy"
    top_k: int = 50
    top_p: float = 0.9
    temperature: float = 1.0
    seed: int = 0
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"sampling must be one of {', '.join(MODES)}, not {self.mode!r}")
        if not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k must be a positive integer, not {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], not {self.top_p!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, not {self.temperature!r}")
        self.rng = np.random.default_rng(self.seed)

    def __call__(self, logits: np.ndarray) -> int:
        """The next token from one position's logits [vocabulary]."""
        row = np.asarray(logits, np.float64).reshape(-1)
        if self.mode == "greedy":
            return int(np.argmax(row))
        order = np.argsort(-row, kind="stable")  # most probable first; equal ones by token id
        scaled = row[order] / self.temperature
        probs = np.exp(scaled - scaled[0])
        probs /= probs.sum()
        if self.mode == "top-k":
            keep = min(self.top_k, row.size)
        else:
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p * (1 - 1e-12))) + 1
        kept = probs[:keep] / probs[:keep].sum()
        return int(order[self.rng.choice(keep, p=kept)])
