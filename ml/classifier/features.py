"""Cue features for the log classifier: a few facts about a line that TF-IDF weighs too lightly in long lines.

TF-IDF rows are L2-normalized, so in a long progress line (Megatron's iteration line has some 40 tokens) the one
token that says "nan" carries little weight, and Megatron prints "number of nan iterations: 0" on every healthy
line besides. A binary cue column keeps its full weight however long the line is. Functions here are pickled by
reference with the shipped pipeline: renaming one breaks loading an artifact.
"""

from __future__ import annotations

import re

# NaN or infinity as a value ("loss: nan", "grad_norm=-inf", "[Loss] nan", "found NaN"), not a part of a name
# (Megatron's "optimizer-unscale-and-check-inf" timer) nor Megatron's counter of NaN iterations, which every healthy
# iteration line prints as "number of nan iterations: 0".
_NAN_VALUE = re.compile(r"(?i)(?<![\w.-])[-+]?(?:nan|inf|infinity)(?![\w.-])(?!\s+iterations)")


def cue_tokens(text: str) -> list[str]:
    """The cues present in a (normalized) line, as tokens for a binary CountVectorizer."""
    cues: list[str] = []
    if _NAN_VALUE.search(text):
        cues.append("nan_value")
    return cues
