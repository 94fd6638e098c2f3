"""A request the cluster can never satisfy is refused in one line, from sinfo/sacctmgr text."""

from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from hpcsweep.config import trial_config_from_dict
from hpcsweep.slurm.cluster_info import gpus_from_gres, qos_limits_enforced
from hpcsweep.slurm.partition_limits import (
    AllocationRequest,
    Asked,
    NodeShape,
    QosLimits,
    check_request,
    parse_mem_mb,
    parse_qos_limits,
    parse_sinfo_partitions,
    parse_time_min,
)
from hpcsweep.sweep.allocation import allocation_request
from hpcsweep.sweep.hpcsweep_hook import trial_allocation
from hydra_plugins.hpcsweep_plugins.config import SlurmLauncherConf

REPO = Path(__file__).resolve().parents[2]
# `sinfo --all --noheader --format='%P|%D|%c|%m|%G|%l|%s'` on the local cluster (nodes of 64 CPUs,
# 512000 MB, 8 A100s), plus a partition made by `scontrol create PartitionName=short ... MaxTime=10 MaxNodes=2`.
SINFO = """\
batch*|4|64|512000|gpu:a100:8|infinite|1-infinite
urgent|4|64|512000|gpu:a100:8|infinite|1-infinite
short|4|64|512000|gpu:a100:8|10:00|1-2
"""
# The same cluster when its nodes declared 8 CPUs and 16000 MB.
SINFO_SMALL_NODES = """\
batch*|4|8|16000|gpu:a100:8|infinite|1-infinite
urgent|4|8|16000|gpu:a100:8|infinite|1-infinite
"""
# Two kinds of node in one partition: GPU nodes, and bigger CPU-only ones.
SINFO_MIXED = """\
mixed*|2|64|512000|gpu:a100:8(S:0-1)|1-00:00:00|1-4
mixed*|3|128|1024000|(null)|1-00:00:00|1-4
"""
# `sacctmgr --noheader --parsable2 show qos format=Name,MaxTRES,MaxTRESPerNode,MaxWall`.
QOS = """\
normal|||
capped|cpu=100,gres/gpu=8,node=2|gres/gpu=4,mem=100G|02:00:00
"""
# hpcsweep's own Slurm launcher: the plugin's generic defaults under configs/hydra/launcher/slurm.yaml.
LAUNCHER = {
    **asdict(SlurmLauncherConf()),
    **{k: v for k, v in yaml.safe_load((REPO / "configs/hydra/launcher/slurm.yaml").read_text()).items()
       if k != "defaults"},
}


def request(nodes=1, time_min=60, cpus=None, gpus=None, mem=None, partition=None, qos=None):
    return AllocationRequest(
        nodes=Asked("trainer.nodes", str(nodes), nodes),
        time_min=Asked("hydra.launcher.timeout_min", str(time_min), time_min),
        cpus_per_node=None if cpus is None else Asked("hydra.launcher.cpus_per_task", str(cpus), cpus),
        gpus_per_node=None if gpus is None else Asked("hydra.launcher.gpus_per_node", str(gpus), gpus),
        mem_per_node=None if mem is None else Asked("hydra.launcher.mem", mem, parse_mem_mb(mem)),
        partition=partition,
        qos=qos,
    )


def refusal(req, sinfo=SINFO, qos=None) -> str:
    with pytest.raises(ValueError) as info:
        check_request(req, parse_sinfo_partitions(sinfo), qos)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_sinfo_lines_become_partitions_with_their_limits():
    batch, urgent, short = parse_sinfo_partitions(SINFO)
    assert (batch.name, batch.default, urgent.default) == ("batch", True, False)
    assert batch.nodes == (NodeShape(count=4, cpus=64, mem_mb=512000, gpus=8, gres="gpu:a100:8"),)
    assert batch.total_nodes == 4
    assert (batch.max_time_min, batch.max_nodes) == (None, None)
    assert (short.max_time_min, short.max_nodes) == (10, 2)
    assert parse_sinfo_partitions("") == []


def test_a_heterogeneous_partition_keeps_each_node_configuration():
    (mixed,) = parse_sinfo_partitions(SINFO_MIXED)
    assert mixed.default and mixed.total_nodes == 5
    assert [(s.count, s.cpus, s.gpus) for s in mixed.nodes] == [(2, 64, 8), (3, 128, 0)]
    assert (mixed.max_time_min, mixed.max_nodes) == (1440, 4)


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("infinite", None), ("UNLIMITED", None), ("n/a", None),
        ("30:00", 30), ("10:00", 10), ("1:30:00", 90), ("4:00:00", 240), ("00:10:00", 10),
        ("1-00:00:00", 1440), ("1-12:00:00", 2160), ("2-1", 2940), ("2-01:30", 2970),
        ("90", 90), ("1:30", 2),
    ],
)
def test_slurm_times_in_minutes(text, minutes):
    assert parse_time_min(text) == minutes


@pytest.mark.parametrize("text", ["soon", "1:2:3:4", "-5", "1-x"])
def test_a_time_that_is_none_of_slurms_forms_is_refused(text):
    with pytest.raises(ValueError, match="is not a Slurm time"):
        parse_time_min(text)


@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("480G", 491520), ("480g", 491520), ("10T", 10485760), ("1024M", 1024), ("500", 500),
        ("512K", 1), ("1536K", 2), ("0", 0),
        ("4GB", None), ("1.5G", None), ("", None), ("-1G", None), ("G", None),
    ],
)
def test_mem_values_in_megabytes(text, mb):
    assert parse_mem_mb(text) == mb


def test_gpus_in_a_node_gres():
    assert gpus_from_gres("gpu:a100:8") == 8
    assert gpus_from_gres("gpu:4") == 4
    assert gpus_from_gres("gpu:a100:4(S:0-1),gpu:v100:2") == 6
    assert gpus_from_gres("gpu:a100:8,shard:a100:16") == 8
    assert gpus_from_gres("(null)") == 0


def test_qos_limits_from_sacctmgr():
    normal, capped = parse_qos_limits(QOS)
    assert normal == QosLimits("normal")
    assert capped.max_wall_min == 120
    assert capped.per_job == {"cpu": 100, "gres/gpu": 8, "node": 2}
    assert capped.per_node == {"gres/gpu": 4, "mem": 102400}


def test_qos_limits_count_only_when_the_cluster_enforces_them():
    assert not qos_limits_enforced("AccountingStorageEnforce = none\n")
    assert not qos_limits_enforced("AccountingStorageEnforce = associations,qos\n")
    assert qos_limits_enforced("AccountingStorageEnforce = associations,limits,qos\n")
    assert qos_limits_enforced("AccountingStorageEnforce = associations,limits,qos,safe\n")
    assert not qos_limits_enforced("")


def test_the_default_request_fits_the_a100_nodes_of_the_local_cluster():
    default = allocation_request(trial_allocation(trial_config_from_dict({})), LAUNCHER)
    assert (default.cpus_per_node.value, default.gpus_per_node.value, default.mem_per_node) == (64, 8, None)
    check_request(default, parse_sinfo_partitions(SINFO))
    check_request(allocation_request(trial_allocation(trial_config_from_dict({"trainer": {"nodes": 4}})), LAUNCHER),
                  parse_sinfo_partitions(SINFO))
    assert refusal(default, SINFO_SMALL_NODES) == (
        "hydra.launcher.cpus_per_task=64: no node of partition batch has more than 8 CPUs"
    )


def test_more_nodes_than_the_partition_has():
    assert refusal(request(nodes=16)) == "trainer.nodes=16 is more than partition batch has: 4 nodes"


def test_more_nodes_than_the_partition_allows_one_job():
    assert refusal(request(nodes=3, time_min=10, partition="short")) == (
        "trainer.nodes=3 is more than partition short allows: MaxNodes=2"
    )
    check_request(request(nodes=2, time_min=10, partition="short"), parse_sinfo_partitions(SINFO))


def test_more_gpus_cpus_or_memory_than_any_node_has():
    assert refusal(request(gpus=16)) == (
        "hydra.launcher.gpus_per_node=16: no node of partition batch has more than 8 GPUs (gres gpu:a100:8)"
    )
    assert refusal(request(cpus=65)) == (
        "hydra.launcher.cpus_per_task=65: no node of partition batch has more than 64 CPUs"
    )
    assert refusal(request(mem="10T")) == (
        "hydra.launcher.mem=10T: no node of partition batch has more than 512000 MB of memory"
    )
    check_request(request(gpus=8, cpus=64, mem="500G"), parse_sinfo_partitions(SINFO))
    check_request(request(mem="512000"), parse_sinfo_partitions(SINFO))


def test_a_time_limit_above_maxtime():
    assert refusal(request(time_min=11, partition="short")) == (
        "hydra.launcher.timeout_min=11 is more than partition short allows: MaxTime=10 min"
    )
    check_request(request(time_min=10, partition="short"), parse_sinfo_partitions(SINFO))
    check_request(request(time_min=10**6), parse_sinfo_partitions(SINFO))


def test_unknown_or_missing_partition_names_the_allowed_ones():
    assert refusal(request(partition="nosuch")) == (
        "hydra.launcher.partition='nosuch' is not a partition of this cluster; allowed: batch, short, urgent"
    )
    no_default = SINFO.replace("batch*", "batch")
    assert refusal(request(), no_default) == (
        "hydra.launcher.partition is not set and this cluster has no default partition; allowed: batch, short, urgent"
    )
    check_request(request(partition="urgent"), parse_sinfo_partitions(no_default))


def test_a_heterogeneous_partition_fits_when_any_node_configuration_does():
    partitions = parse_sinfo_partitions(SINFO_MIXED)
    check_request(request(cpus=128, nodes=3), partitions)
    check_request(request(gpus=8, nodes=2), partitions)
    check_request(request(mem="1000G"), partitions)
    assert refusal(request(cpus=129), SINFO_MIXED) == (
        "hydra.launcher.cpus_per_task=129: no node of partition mixed has more than 128 CPUs"
    )
    assert refusal(request(gpus=8, nodes=3), SINFO_MIXED) == (
        "trainer.nodes=3 is more than partition mixed has nodes with hydra.launcher.gpus_per_node=8 on each: "
        "2 (its nodes: 2 x (64 CPUs, 8 GPUs, 512000 MB), 3 x (128 CPUs, 0 GPUs, 1024000 MB))"
    )
    assert refusal(request(gpus=1, cpus=128), SINFO_MIXED).startswith(
        "trainer.nodes=1 is more than partition mixed has nodes with hydra.launcher.cpus_per_task=128, "
        "hydra.launcher.gpus_per_node=1 on each: 0 "
    )
    assert refusal(request(time_min=1441), SINFO_MIXED) == (
        "hydra.launcher.timeout_min=1441 is more than partition mixed allows: MaxTime=1440 min"
    )


def test_qos_limits_per_job_and_per_node():
    (_, capped) = parse_qos_limits(QOS)
    check_request(request(nodes=2, cpus=50, gpus=4, mem="100G", time_min=120), parse_sinfo_partitions(SINFO), capped)
    assert refusal(request(time_min=121), qos=capped) == (
        "hydra.launcher.timeout_min=121 is more than qos capped allows: MaxWall=120 min"
    )
    assert refusal(request(nodes=3), qos=capped) == (
        "trainer.nodes=3 is more than qos capped allows: MaxTRESPerJob node=2"
    )
    assert refusal(request(gpus=8), qos=capped) == (
        "hydra.launcher.gpus_per_node=8 is more than qos capped allows: MaxTRESPerNode gres/gpu=4"
    )
    assert refusal(request(nodes=2, cpus=64), qos=capped) == (
        "trainer.nodes=2 x hydra.launcher.cpus_per_task=64 = 128 cpu per job is more than qos capped allows: "
        "MaxTRESPerJob cpu=100"
    )
    assert refusal(request(mem="200G"), qos=capped).startswith("hydra.launcher.mem=200G is more than qos capped")


def test_the_request_names_the_key_that_set_each_amount():
    trial = trial_allocation(trial_config_from_dict({"trainer": {"nodes": 2, "nproc_per_node": 4}}))
    req = allocation_request(trial, {**LAUNCHER, "mem": "480G", "partition": "urgent", "qos": "high"})
    assert str(req.gpus_per_node) == "trainer.nproc_per_node=4"
    assert (req.nodes.value, req.mem_per_node.value, req.partition, req.qos) == (2, 491520, "urgent", "high")
    cpu_only = allocation_request(trial, {**LAUNCHER, "gpus_per_node": 0, "cpus_per_task": None, "mem": "0"})
    assert (cpu_only.gpus_per_node, cpu_only.cpus_per_node, cpu_only.mem_per_node) == (None, None, None)
    with pytest.raises(ValueError, match=r"hydra.launcher.mem='4GB' is not allowed: .*480G"):
        allocation_request(trial, {**LAUNCHER, "mem": "4GB"})
