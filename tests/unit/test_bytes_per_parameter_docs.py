"""The bytes a parameter that the README and docs/user quote are the memory plan's own figures.

Issue 31 found three stories (about 16, ~112 GB for 7B under DDP, ~180 GB); the plan is the one
source, and this test fails when a doc and the plan part ways.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpcsweep.memory_plan import TrainingSetup
from hpcsweep.memory_plan.model_shape import shape_from_hf_config
from hpcsweep.memory_plan.plan import plan_memory
from tests.wrapped_models import LLAMA_7B

REPO = Path(__file__).resolve().parents[2]


def bytes_a_parameter(world_size: int) -> float:
    """Full fine-tuning with AdamW in bf16 on CUDA: every part but activations, the loss and overhead, per parameter."""
    plan = plan_memory(shape_from_hf_config(LLAMA_7B), TrainingSetup(precision="bf16", batch_size=1, seq_len=2048,
                                                                     world_size=world_size))
    held = plan.weights + plan.gradients + plan.optimizer + plan.temporaries
    return held / plan.total_parameters


def test_the_plans_bytes_a_parameter_are_22_on_one_gpu_and_26_under_ddp():
    assert (bytes_a_parameter(1), bytes_a_parameter(8)) == (pytest.approx(22), pytest.approx(26))


@pytest.mark.parametrize("doc, pattern", [
    ("README.md", r"full fine-tuning with AdamW: (\d+) bytes a parameter under DDP"),
    ("docs/user/parallel.md", r"\((\d+) bytes per parameter in bf16/fp32 mixed precision over several GPUs"),
    ("docs/user/fine-tune.md", r"22 bytes per parameter on one GPU, (\d+) under\s+DDP"),
    ("docs/user/memory-plan.md", r"22 B a parameter on one GPU, (\d+) B under DDP"),
])
def test_each_doc_quotes_the_plans_ddp_figure(doc, pattern):
    found = re.search(pattern, (REPO / doc).read_text(), flags=re.IGNORECASE)
    assert found, f"{doc} no longer says {pattern!r}: say the plan's figure ({bytes_a_parameter(8):.0f})"
    assert int(found.group(1)) == round(bytes_a_parameter(8))


def test_one_gpu_figure_in_the_docs_is_the_plans():
    for doc, pattern in (("docs/user/fine-tune.md", r"(\d+) bytes per parameter on one GPU"),
                         ("docs/user/memory-plan.md", r"(\d+) B a parameter on one GPU")):
        found = re.search(pattern, (REPO / doc).read_text())
        assert found and int(found.group(1)) == round(bytes_a_parameter(1)), doc
