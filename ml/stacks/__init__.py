"""Stack aggregation for hangs and fail-slow (ByteRobust section 5), localized with the job's parallel groups.

Every rank's main-thread stack (from `py-spy dump --json`) is normalized (function and module per frame, no
line numbers, addresses or numbering) and hashed; ranks with the same signature form a group and the largest
group is taken as healthy. Ranks blocked in a collective are victims; ranks elsewhere while the others wait,
ranks without a stack, and peers that never reached a collective their group waits in are culprits. The
machine is named when the culprits sit on it alone; otherwise the smallest parallel group covering them is.
"""

from ml.stacks.analysis import StackAnalysis, StackGroup, analyze
from ml.stacks.frames import (
    COLLECTIVE,
    COMPUTE,
    DATA,
    MAX_TREE_DEPTH,
    NO_STACK,
    OTHER,
    STATES,
    classify,
    frame_label,
    main_thread_frames,
    normalize_frame,
    rank_ranges,
    signature_of,
)
from ml.stacks.report import findings
from ml.stacks.rounds import RoundsAnalysis, analyze_rounds, round_findings

__all__ = [
    "COLLECTIVE",
    "COMPUTE",
    "DATA",
    "MAX_TREE_DEPTH",
    "NO_STACK",
    "OTHER",
    "STATES",
    "RoundsAnalysis",
    "StackAnalysis",
    "StackGroup",
    "analyze",
    "analyze_rounds",
    "classify",
    "findings",
    "frame_label",
    "main_thread_frames",
    "normalize_frame",
    "rank_ranges",
    "round_findings",
    "signature_of",
]
