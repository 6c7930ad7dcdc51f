"""Checkpoint saves in training logs: Megatron-LM, DeepSpeed, PyTorch DCP (torchtitan), Hugging Face Trainer.

The lines are the frameworks' own format strings (Megatron-LM megatron/training/checkpointing.py, DeepSpeed
deepspeed/runtime/engine.py, torchtitan torchtitan/components/checkpoint.py, transformers trainer.py), with the
launcher and logger prefixes they are printed with.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agents.parsers import parse_text
from agents.parsers.training import TrainingLogParser
from lab.sim import logformat
from tests.agents.test_parsers_training import check_event

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _saves(text: str) -> list[tuple[int | None, dict]]:  # type: ignore[type-arg]
    events = parse_text(TrainingLogParser(path="/logs/train.log"), text, now=NOW)
    for e in events:
        check_event(e)
    return [(e.rank, e.fields) for e in events if e.kind == "checkpoint_saved"]


@pytest.mark.parametrize(
    ("line", "rank", "fields"),
    [
        (
            "  successfully saved checkpoint from iteration    2000 to /ckpt [ t 1/1, p 1/1 ]",
            None,
            {"framework": "megatron", "step": 2000, "path": "/ckpt"},
        ),
        (
            "  successfully saved checkpoint at iteration    2000 to /data/ckpt",
            None,
            {"framework": "megatron", "step": 2000, "path": "/data/ckpt"},
        ),
        (
            "[2024-05-01 12:00:00,123] [INFO] [logging.py:96:log_dist] [Rank 0] Saving model checkpoint: "
            "/ckpt/global_step2000/mp_rank_00_model_states.pt",
            0,
            {"framework": "deepspeed", "step": 2000, "path": "/ckpt/global_step2000/mp_rank_00_model_states.pt"},
        ),
        (
            "[2024-05-01 12:00:01,123] [INFO] [engine.py:3312:_save_zero_checkpoint] zero checkpoint saved "
            "/ckpt/global_step2000/zero_pp_rank_0_mp_rank_00_optim_states.pt",
            None,
            {
                "framework": "deepspeed",
                "step": 2000,
                "path": "/ckpt/global_step2000/zero_pp_rank_0_mp_rank_00_optim_states.pt",
            },
        ),
        (
            "[INFO|trainer.py:3478] 2024-05-01 12:00:00,123 >> Saving model checkpoint to out/checkpoint-500",
            None,
            {"framework": "hf_trainer", "step": 500, "path": "out/checkpoint-500"},
        ),
        (
            "[rank0]:[titan] 2025-01-01 10:00:03,000 - root - INFO - Saving a full checkpoint at last step, step 1000.",
            0,
            {"framework": "dcp", "phase": "started", "step": 1000},
        ),
    ],
)
def test_each_framework_s_save_line(line: str, rank: int | None, fields: dict) -> None:  # type: ignore[type-arg]
    assert _saves(line + "\n") == [(rank, fields)]


def test_torchtitan_lines_take_the_step_of_the_last_step_line() -> None:
    text = (
        "[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - step: 40  loss:  7.1  memory: 30.1GiB\n"
        "[rank0]:[titan] 2025-01-01 10:00:00,100 - root - INFO - Saving the checkpoint (or staging if async is "
        "enabled).\n"
        "[rank0]:[titan] 2025-01-01 10:00:03,310 - root - INFO - Finished saving the checkpoint (or staging if async "
        "is enabled)in 3.21 seconds.\n"
    )
    assert _saves(text) == [
        (0, {"framework": "dcp", "phase": "started", "step": 40, "step_from": "last_step"}),
        (0, {"framework": "dcp", "phase": "finished", "seconds": 3.21, "step": 40, "step_from": "last_step"}),
    ]


def test_a_save_before_any_step_has_no_step_and_the_start_of_a_megatron_save_is_not_a_save() -> None:
    assert _saves("Saving the checkpoint (or staging if async is enabled).\n") == [
        (None, {"framework": "dcp", "phase": "started"})
    ]
    # The simulator prints Megatron's lines: "saving ..." before, "successfully saved ..." after.
    text = logformat.megatron_saving(3000) + "\n" + logformat.megatron_saved(3000) + "\n"
    assert _saves(text) == [(None, {"framework": "megatron", "step": 3000, "path": logformat.CHECKPOINT_DIR})]


def test_lines_that_mention_checkpoints_without_saving_one() -> None:
    text = (
        "  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 2000\n"
        "Loading checkpoint shards: 100%|██████████| 4/4 [00:02<00:00,  1.71it/s]\n"
        "resuming from checkpoint at step=2000\n"
    )
    assert _saves(text) == []


# --- loads: the checkpoint a restarted job resumed from (issue 40) ---


def _loads(text: str) -> list[tuple[int | None, dict]]:  # type: ignore[type-arg]
    events = parse_text(TrainingLogParser(path="/logs/train.log"), text, now=NOW)
    for e in events:
        check_event(e)
    return [(e.rank, e.fields) for e in events if e.kind == "checkpoint_loaded"]


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (
            "  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 2000",
            {"framework": "megatron", "step": 2000, "path": "/ckpt"},
        ),
        (  # Megatron-LM before the parallel ranks were printed
            "  successfully loaded checkpoint from /data/ckpt at iteration 2000",
            {"framework": "megatron", "step": 2000, "path": "/data/ckpt"},
        ),
        (
            "[INFO|trainer.py:2188] 2024-05-01 12:00:00,123 >>   Continuing training from global step 500",
            {"framework": "hf_trainer", "step": 500},
        ),
        (
            "[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - Loading the checkpoint at step 1000.",
            {"framework": "dcp", "step": 1000},
        ),
        (
            "2026-11-28 18:00:42,000 INFO train.py:141 rank=0 resuming from checkpoint at step=34355",
            {"framework": "generic", "step": 34355},
        ),
    ],
)
def test_each_framework_s_load_line(line: str, fields: dict) -> None:  # type: ignore[type-arg]
    assert [f for _, f in _loads(line + "\n")] == [fields]


def test_the_start_of_a_load_and_a_shard_progress_bar_are_no_load() -> None:
    # The simulator prints Megatron's lines: "loading ..." before, "successfully loaded ..." after: one load.
    text = "\n".join(logformat.megatron_loading(3000)) + "\n"
    text += "Loading checkpoint shards: 100%|██████████| 4/4 [00:02<00:00,  1.71it/s]\n"
    assert [f for _, f in _loads(text)] == [{"framework": "megatron", "step": 3000, "path": logformat.CHECKPOINT_DIR}]
    assert _saves(text) == []
