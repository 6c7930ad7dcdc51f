"""Rules for explicit failures: parsed log events (Xid, AER, IB, NCCL, CUDA, OOM, tracebacks, ...) into findings.

Each rule reads the events the node agent's parsers emit (`kind` and `fields` as in agents/parsers) and says
what broke, where, and whose fault it is:

- hardware signatures (fatal Xids, uncorrectable ECC, IB completion errors) point at the machine they were
  logged on: blame infrastructure;
- the same exception on most ranks is the job's own code: blame user code, never a machine;
- ambiguous errors (illegal memory access, a segfault) on one machine only are "suspect, diagnose";
- what victims print (watchdog timeouts, peers' NCCL errors, torchrun's summary) is a symptom: it
  corroborates a cause and may point at one (a desync report's lagging rank, a NCCL remote peer).

Repeats of one claim (an Xid code on a node, IB errors on a node, one exception on many ranks) are one finding
whose evidence lists the records and counts them.

The rules live by family: common (plumbing), hardware, network, symptoms, runtime (CUDA, OOM, data loaders,
storage), tracebacks (and crashes), classified (lines no rule knows) and pipeline (the order, the merging).
"""

from ml.signatures.common import (
    BURST_S,
    DETECTOR,
    LINE_CHARS,
    MAX_LINES,
    MAX_LIST,
    MAX_SIGNALS,
    MIN_CLASSIFIER_P,
    Classify,
)
from ml.signatures.pipeline import detect

__all__ = [
    "BURST_S",
    "DETECTOR",
    "LINE_CHARS",
    "MAX_LINES",
    "MAX_LIST",
    "MAX_SIGNALS",
    "MIN_CLASSIFIER_P",
    "Classify",
    "detect",
]
