"""The GGUF block layouts the kernels read, as Python reads them (the torch path's de-quantization, the loader, the
kernel table's weight formats). The library publishes its own (``peagle::formats``, from ``csrc/kernels.h``), which
:func:`peagle.kernels.available` checks against these when it loads: a library that differs is not used."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockSizes:
    """GGUF block layouts as the kernels read them (``csrc/kernels.h``, published by ``peagle::formats``): per
    format (bytes a file block, bytes a packed group's block, weights a block); the bytes of a packed bf16
    (group, k pair); the columns a packed group interleaves."""

    formats: dict[str, tuple[int, int, int]]
    bf16_pair: int
    group: int

    @property
    def packed(self) -> frozenset[int]:
        return frozenset(p for _, p, _ in self.formats.values())


# The layouts as Python reads them (the torch path's de-quantization, the loader, weight_format): the library's
# own (peagle::formats) are checked against them when it loads, and a library that differs is not used.
BLOCK_SIZES = BlockSizes(
    {"q8_0": (34, 544, 32), "q4_0": (18, 288, 32), "q4_1": (20, 320, 32), "q5_0": (22, 352, 32), "q5_1": (24, 384, 32),
     "q4_k": (144, 2368, 256), "q5_k": (176, 2880, 256), "q6_k": (210, 3392, 256)}, 64, 16)
