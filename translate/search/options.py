"""How to decode: one frozen options object that the CLI, the API, the server and `predict` build and pass down."""

from __future__ import annotations

from dataclasses import dataclass

from core.runtime.errors import InputError


@dataclass(frozen=True)
class SearchOptions:
    """Search settings of one decoding job."""

    beam_size: int = 5  # 1 runs greedy search (the same output, cheaper)
    n_best: int = 1  # translations returned per sentence, best first
    alpha: float = 0.6  # GNMT length-penalty exponent (0 ranks by the raw log-probability)
    max_len_a: float = 1.5  # output limit: max_len_a x source subwords + max_len_b (fairseq's names)
    max_len_b: int = 10
    batch_size: int = 64  # sentences per search batch (longest first); it does not change the output

    def __post_init__(self) -> None:
        if self.beam_size < 1 or self.batch_size < 1:
            raise InputError(f"`beam_size` ({self.beam_size}) and `batch_size` ({self.batch_size}) must be >= 1")
        if not 1 <= self.n_best <= self.beam_size:
            raise InputError(f"`n_best` ({self.n_best}) must be between 1 and `beam_size` ({self.beam_size})")
        if self.max_len_a < 0 or self.max_len_b < 1:
            raise InputError(f"`max_len_a` ({self.max_len_a}) must be >= 0 and `max_len_b` ({self.max_len_b}) >= 1")

