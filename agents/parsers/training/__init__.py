"""Training log parser: NCCL, watchdog timeouts, CUDA errors, tracebacks, torchrun failures, progress.

Lines may carry launcher prefixes (torchrun `[rank3]:` / `[default3]:`, srun `3: `, timestamps,
glog/c10 `[E321 02:07:08.408 file.cc:607]`); they are stripped, and the rank and time taken from them.
Multi-line blocks (Python tracebacks, torchrun's ChildFailedError table, `terminate called ...` with
its `what():`, C++ frame dumps, the NCCL desync report) are collected per prefix, so interleaved ranks
do not mix, and each becomes one event. A line may yield more than one event (a progress bar with an
error glued to its end; a NCCL remote error that carries an IB completion error).

Modules: `prefixes` (rank and time), `parser` (the dispatch), `classify` (single-line rules in order)
and the rules by topic (`nccl`, `verbs` (RDMA verbs failures, IB async events), `mismatch` (collectives the
ranks disagree on), `watchdog`, `cuda`, `storage` (file system and object store errors), `crashes`, `elastic`
(and other launchers), `loss_scale` (fp16 overflows), `progress`, `checkpoints` (saves)), `blocks` and the
multi-line blocks (`tracebacks`, `child_failed`, `cpp`, `flight_recorder`, `ras` (NCCL RAS reports); the
desync report is in `watchdog`, device-side assertion lines in `cuda`). `lab.evaluation.parser_corpus` measures them
on real logs.
"""

from agents.parsers.training.nccl import IBV_WC_STATUS, NCCL_CODES
from agents.parsers.training.parser import TrainingLogParser
from agents.parsers.training.progress import DEFAULT_STEP_PATTERNS

__all__ = ["DEFAULT_STEP_PATTERNS", "IBV_WC_STATUS", "NCCL_CODES", "TrainingLogParser"]
