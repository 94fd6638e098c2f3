"""Pending reasons: squeue's %r text, which reasons never clear, and how they join sacct's states."""

from __future__ import annotations

import pytest

from hpcsweep.slurm.job_states import (
    needs_nodes,
    parse_sacct,
    parse_squeue,
    with_reasons,
    with_verdicts,
)
from hpcsweep.slurm.nodes import parse_node_states
from hpcsweep.slurm.pending import (
    NEVER_CLEARS,
    PendingReason,
    never_clears,
    parse_reason,
)

# squeue --noheader --array --jobs 70 --format '%i|%T|%N|%r' (Slurm 22.05)
SQUEUE = """\
70_0|RUNNING|node1|None
70_1|PENDING||PartitionConfig
70_2|PENDING||ReqNodeNotAvail, UnavailableNodes:node[3-4]
70_3|PENDING||Priority
70_[4-5%2]|PENDING||JobArrayTaskLimit
"""

# scontrol show nodes --oneliner, trimmed to the fields the parser reads
NODES_DOWN = """\
NodeName=node1 Arch=x86_64 CoresPerSocket=32 CPUAlloc=64 CPUTot=64 State=ALLOCATED Partitions=batch,urgent
NodeName=node3 Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUTot=64 State=DOWN* Partitions=batch,urgent Reason=Not responding [slurm@2026-01-01T00:00:00]
NodeName=node4 Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUTot=64 State=IDLE+DRAIN Partitions=batch,urgent Reason=bad gpu [root@2026-01-01T00:00:00]
"""
NODES_ONE_REBOOTING = NODES_DOWN.replace("State=IDLE+DRAIN", "State=IDLE+REBOOT_ISSUED")


def nodes_by_name(text: str):
    return {node.name: node for node in parse_node_states(text)}


@pytest.mark.parametrize("code", sorted(NEVER_CLEARS))
def test_each_listed_reason_never_clears_and_says_why(code):
    why = never_clears(parse_reason(code))
    assert why and why == NEVER_CLEARS[code]


@pytest.mark.parametrize(
    "text",
    [
        "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "QOSMaxWallDurationPerJobLimit",
        "QOSMaxNodePerJobLimit", "QOSMaxGRESPerJob", "AssocMaxWallDurationPerJobLimit", "InvalidAccount",
        "InvalidQOS", "BadConstraints", "DependencyNeverSatisfied",
        "QOSMaxCpuPerJobLimit", "AssocMaxGRESPerJob",  # the per-job family, not listed one by one
    ],
)
def test_reasons_that_never_clear(text):
    assert never_clears(parse_reason(text))


@pytest.mark.parametrize(
    "text",
    [
        "Priority", "Resources", "JobArrayTaskLimit", "BeginTime", "Dependency", "JobHeldUser",
        "QOSMaxJobsPerUserLimit", "AssocGrpGRES", "QOSGrpNodeLimit", "None",
        "ReqNodeNotAvail, May be reserved for other job", "ReqNodeNotAvail, Reserved for maintenance",
    ],
)
def test_reasons_that_clear(text):
    assert never_clears(parse_reason(text)) is None


def test_parse_reason_splits_code_detail_and_nodes():
    assert parse_reason("ReqNodeNotAvail, UnavailableNodes:node[3-4],gpu07") == PendingReason(
        "ReqNodeNotAvail", "UnavailableNodes:node[3-4],gpu07", ("node3", "node4", "gpu07")
    )
    assert parse_reason("(PartitionConfig)") == PendingReason("PartitionConfig")
    assert parse_reason("ReqNodeNotAvail, UnavailableNodes:node[3-").unavailable_nodes == ()


def test_req_node_not_avail_never_clears_only_when_every_node_is_down_or_drained():
    reason = parse_reason("ReqNodeNotAvail, UnavailableNodes:node[3-4]")
    why = never_clears(reason, nodes_by_name(NODES_DOWN))
    assert why and "node3,node4" in why and "DOWN or DRAINED" in why
    assert never_clears(reason, nodes_by_name(NODES_ONE_REBOOTING)) is None
    assert never_clears(reason, None) is None  # node states unknown: no alarm
    assert never_clears(parse_reason("ReqNodeNotAvail, UnavailableNodes:node9"), nodes_by_name(NODES_DOWN)) is None


def test_parse_squeue_keeps_reasons_of_queued_tasks_only():
    states = parse_squeue(SQUEUE)
    assert states["70_0"].reason == "" and states["70_0"].nodes == "node1"
    assert states["70_1"].reason == "PartitionConfig"
    assert states["70_2"].reason == "ReqNodeNotAvail, UnavailableNodes:node[3-4]"
    assert states["70_5"].reason == "JobArrayTaskLimit" and states["70_5"].queued


def test_sacct_states_take_squeue_reasons_and_verdicts():
    sacct = parse_sacct(
        "70_0|RUNNING|60|cpu=64,gres/gpu=8,node=1|node1\n"
        "70_[1-5%2]|PENDING|0||None assigned\n"
    )
    merged = with_reasons(sacct, parse_squeue(SQUEUE))
    assert merged["70_0"].reason == "" and merged["70_0"].elapsed_s == 60
    assert merged["70_1"].reason == "PartitionConfig" and merged["70_3"].reason == "Priority"
    assert needs_nodes(merged)

    judged = with_verdicts(merged, parse_node_states(NODES_DOWN))
    assert judged["70_1"].never_starts == NEVER_CLEARS["PartitionConfig"]
    assert "node3,node4" in judged["70_2"].never_starts
    assert judged["70_3"].never_starts == "" and judged["70_4"].never_starts == ""
    assert with_verdicts(merged, None)["70_2"].never_starts == ""


def test_no_node_states_needed_without_unavailable_nodes():
    states = parse_squeue("71_0|PENDING||ReqNodeNotAvail, May be reserved for other job\n71_1|PENDING||Priority\n")
    assert not needs_nodes(states)
