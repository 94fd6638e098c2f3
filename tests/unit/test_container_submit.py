"""What a Slurm sweep in a container submits with (``hpcsweep.sweep.containers``): the variables forced inside,
the paths mounted, submitit's parameters and batch-script step, the token preparation's step, and the refusal
before any Slurm command. The runtimes' own flags: ``test_container_flags``.

Nothing here runs in a real runtime (docs/user/containers.md says what is not built yet)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcsweep.config import trial_config_from_dict
from hpcsweep.container.flags import ContainerLaunch, apptainer_setup
from hpcsweep.sweep.allocation import executor_parameters
from hpcsweep.sweep.containers import (
    check_container,
    check_local_container,
    forced_variables,
    submission_params,
    sweep_launch,
    trial_paths,
    with_container,
)
from hpcsweep.sweep.hooks import Allocation, TrialHook, trial_hook
from hpcsweep.sweep.snapshot import snapshot_setup_lines
from hpcsweep.sweep.text_preparation import preparation_script

from .fake_slurm import fake_slurm  # noqa: F401 (a fixture)

KEY = "hydra.launcher.container"
FORCED = [
    "NCCL_IB_DISABLE", "NCCL_NET_GDR_LEVEL", "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT", "NCCL_CROSS_NIC",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD",
    "NCCL_IB_HCA", "NCCL_TOPO_FILE", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "TORCH_DISTRIBUTED_DEBUG",
    "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "PYTHONPATH", "PYTHONSAFEPATH",
    "OMP_NUM_THREADS", "HPCSWEEP_FAULT", "HPCSWEEP_BUDGET_POLL_S",
]


def test_the_variables_hpcsweep_forces():
    assert forced_variables() == FORCED
    # Every variable the code snapshot's setup lines export is among them.
    exported = [line.split()[1].split("=")[0] for line in snapshot_setup_lines(Path("/s/.code"))]
    assert exported == ["PYTHONPATH", "PYTHONSAFEPATH"] and set(exported) <= set(FORCED)


def test_the_auto_launchers_local_fallback_reads_the_launcher_config():
    from omegaconf import OmegaConf

    from hydra_plugins.hpcsweep_plugins.config import AutoLauncherConf

    config = OmegaConf.structured(AutoLauncherConf)
    check_local_container(config)
    check_local_container(OmegaConf.create({"local_parallelism": 2}))  # hydra/launcher=local has no container key
    config.container.runtime, config.container.image = "pyxis", "/i.sqsh"
    with pytest.raises(ValueError, match=rf"^{KEY}.runtime='pyxis' is not allowed here"):
        check_local_container(config)


# What a sweep submits with


class PathsHook(TrialHook):
    def container_paths(self, trials):
        return [("model.path", "/models/llama"), ("data.cache_dir", "multirun/token-cache")]


def app_launcher():
    return SimpleNamespace(task_function=trial_hook(PathsHook())(lambda cfg: cfg))


LAUNCHER = {"submitit_folder": "/s/.submitit/%j", "name": "hpcsweep", "timeout_min": 60, "cpus_per_task": 64,
            "gpus_per_node": 8, "max_num_timeout": 20, "additional_parameters": {}, "setup": ["module load cuda"]}


def submitted(tmp_path, container):
    """The launcher settings of a submission from ``tmp_path`` into ``tmp_path/sweep`` (snapshot in ``.code``)."""
    sweep_dir = tmp_path / "sweep"
    params = {**LAUNCHER, "submitit_folder": f"{sweep_dir}/.submitit/%j", "container": container}
    return params, submission_params(app_launcher(), [], params, sweep_dir, sweep_dir / ".code")


def test_a_pyxis_sweep_submits_its_flags_and_the_images_python(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params, out = submitted(tmp_path, {"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3",
                                       "mounts": ["/data:/data:ro"], "env": ["NCCL_SOCKET_IFNAME"]})
    parameters = executor_parameters(Allocation(nodes=2), out)
    assert parameters["slurm_srun_args"] == [
        "--kill-on-bad-exit=1",
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        f"--container-mounts=/data:/data:ro,/models/llama:/models/llama,{tmp_path}/sweep:{tmp_path}/sweep,"
        f"{tmp_path}/multirun/token-cache:{tmp_path}/multirun/token-cache",
        f"--container-workdir={tmp_path}",
        "--container-env=" + ",".join([*FORCED, "NCCL_SOCKET_IFNAME"]),
        "--no-container-mount-home",
    ]
    assert parameters["slurm_python"] == "python3"
    assert parameters["slurm_setup"] == ["module load cuda", *snapshot_setup_lines(tmp_path / "sweep" / ".code")]
    # The token cache a trial writes is made before submitting: a runtime mounts only what exists.
    assert (tmp_path / "multirun" / "token-cache").is_dir()
    # As submitit writes it into the batch script (update_parameters, then its own sbatch text).
    from submitit.slurm.slurm import SlurmExecutor

    from hpcsweep.sweep.slurm_submit import slurm_executor

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # no srun on this machine
    executor = slurm_executor(out, parameters)._executor
    script = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    (step,) = [shlex.split(line) for line in script.splitlines() if line.startswith("srun ")]
    tail = [*parameters["slurm_srun_args"], "python3", "-u", "-m", "submitit.core._submit",
            f"{tmp_path}/sweep/.submitit/%j"]
    assert step[-len(tail):] == tail


def test_an_apptainer_sweep_starts_the_images_python_through_apptainer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image = tmp_path / "pt.sif"
    _, out = submitted(tmp_path, {"runtime": "apptainer", "image": "pt.sif", "workdir": "/work"})
    parameters = executor_parameters(Allocation(), out)
    assert parameters["slurm_srun_args"] == ["--kill-on-bad-exit=1"]
    assert parameters["slurm_python"] == (
        f"apptainer exec --nv -B /models/llama:/models/llama,{tmp_path}/sweep:{tmp_path}/sweep,"
        f"{tmp_path}/multirun/token-cache:{tmp_path}/multirun/token-cache --pwd /work {image} python3")
    # The setup lines force the variables after the code snapshot's lines set PYTHONPATH.
    assert parameters["slurm_setup"] == ["module load cuda", *snapshot_setup_lines(tmp_path / "sweep" / ".code"),
                                         *apptainer_setup(FORCED)]


def test_an_oci_sweep_names_its_bundle(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, out = submitted(tmp_path, {"runtime": "oci", "image": "/bundles/pt"})
    parameters = executor_parameters(Allocation(), out)
    assert parameters["slurm_srun_args"] == ["--kill-on-bad-exit=1", "--container=/bundles/pt"]
    assert parameters["slurm_python"] == "python3"


def test_no_container_submits_as_before(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params, out = submitted(tmp_path, None)
    parameters = executor_parameters(Allocation(), out)
    assert parameters["slurm_srun_args"] == ["--kill-on-bad-exit=1"] and "slurm_python" not in parameters
    assert with_container({"setup": ["x"]}, None) == {"setup": ["x"]}


def test_the_token_preparation_runs_in_the_container_too():
    launch = ContainerLaunch("pyxis", srun_args=("--container-image=/i.sqsh", "--no-container-mount-home"))
    assert preparation_script(["export A=1"], launch.step_prefix()).splitlines()[-1] == (
        'exec srun --ntasks=1 --container-image=/i.sqsh --no-container-mount-home "$python" -m hpcsweep.prepare "$@"')
    launch = ContainerLaunch("apptainer", prefix=("apptainer", "exec", "--nv", "/my images/pt.sif"))
    assert preparation_script([], launch.step_prefix()).splitlines()[-1] == (
        "exec apptainer exec --nv '/my images/pt.sif' \"$python\" -m hpcsweep.prepare \"$@\"")
    assert preparation_script([]).splitlines()[-1] == 'exec "$python" -m hpcsweep.prepare "$@"'


def test_the_script_step_runs_its_words_before_the_python(tmp_path):
    """The words of a container's step come first, quoted; the corpus's arguments still never pass a shell."""
    marker = tmp_path / "argv"
    wrapper = tmp_path / "wrap"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {marker}\n')
    wrapper.chmod(0o755)
    script = tmp_path / "prepare.sh"
    script.write_text(preparation_script([], [str(wrapper), "--flag=a b"]))
    subprocess.run(["sh", str(script), sys.executable, "--request", "r $x.json"], check=True, timeout=30)
    assert marker.read_text().splitlines() == ["--flag=a b", sys.executable, "-m", "hpcsweep.prepare", "--request",
                                               "r $x.json"]


def test_the_login_node_check_refuses_before_any_slurm_command(tmp_path, monkeypatch, fake_slurm):  # noqa: F811
    """A refused container stops the sweep with one line naming the key: no scontrol, no sbatch, 0 jobs."""
    from hpcsweep.sweep.slurm_submit import launch_on_slurm

    monkeypatch.chdir(tmp_path)
    app = foreign_launcher({"runtime": "pyxis", "image": "nvcr.io/nvidia/pytorch:24.05-py3"})
    with pytest.raises(SystemExit) as stopped:
        launch_on_slurm(app, [["db=mysql"]], 0)
    assert stopped.value.code == 2
    assert fake_slurm.calls("scontrol") == []
    with pytest.raises(ValueError, match=rf"^{KEY}.image='{tmp_path}/none.sif' is not allowed: "):
        check_container(app, [], {"container": {"runtime": "apptainer", "image": str(tmp_path / "none.sif")}},
                        tmp_path / "sweep")


def foreign_launcher(container):
    """The foreign test app's launcher (``test_launcher_hooks``'s), with ``container``."""
    from .test_launcher_hooks import SLURM, launcher

    app = launcher(f"file://{Path(__file__).resolve().parents[2]}/tests/foreign_app/foreign_app/conf",
                   **SLURM, container=container)
    app.task_function = trial_hook(TrialHook())(lambda cfg: cfg)
    return app


# hpcsweep's own trials


def test_an_hpcsweep_trial_mounts_its_model_data_cache_tokenizer_and_tasks():
    trial = trial_config_from_dict({
        "model": {"path": "/models/llama"},
        "data": {"kind": "chat", "files": ["/corpus/chat/*.jsonl", "/corpus/more/a.jsonl"],
                 "tokenizer": "/tok", "chat_template": "/templates/chatml.jinja", "cache_dir": "cache"},
        "tasks": {"names": ["qa"], "include_path": "/tasks"},
        "nccl": {"topo_file": "/etc/nccl/topo.xml"},
        "logging": {"backends": ["tensorboard", "mlflow"], "mlflow": {"tracking_uri": "sqlite:////runs/mlflow.db"}},
    })
    assert trial_paths(trial) == [
        ("model.path", "/models/llama"), ("data.files", "/corpus/chat"), ("data.files", "/corpus/more"),
        ("data.cache_dir", "cache"), ("data.tokenizer", "/tok"), ("data.chat_template", "/templates"),
        ("tasks.include_path", "/tasks"), ("nccl.topo_file", "/etc/nccl"), ("logging.mlflow.tracking_uri", "/runs"),
    ]
    assert trial_paths(trial_config_from_dict({})) == []


def test_a_preference_trial_mounts_its_chat_template_as_a_chat_trial_does():
    trial = trial_config_from_dict({
        "model": {"path": "/models/v3"},
        "objective": {"kind": "dpo"},
        "data": {"kind": "preference", "files": "/pairs/*.jsonl", "chat_template": "/templates/chatml.jinja",
                 "cache_dir": "cache"},
    })
    assert ("data.chat_template", "/templates") in trial_paths(trial)


def test_the_launcher_config_and_its_override_keys():
    from hydra_plugins.hpcsweep_plugins.config import launcher_keys
    from hpcsweep.sweep.override_keys import unknown_launcher_key_message

    keys = launcher_keys()["slurm"]
    assert {"container", "container.runtime", "container.image", "container.mounts", "container.workdir",
            "container.env", "container.python"} <= set(keys)
    assert unknown_launcher_key_message("hydra.launcher.container.runtime", "slurm", keys) is None
    message = unknown_launcher_key_message("hydra.launcher.container.runtme", "slurm", keys)
    assert message.startswith("hydra.launcher.container.runtme is not a key of the Slurm launcher; did you mean "
                              "hydra.launcher.container.runtime?")
    assert "container.runtime," not in message  # the keys shown are the launcher's own


def test_sweep_launch_without_a_container_is_none(tmp_path):
    assert sweep_launch(app_launcher(), [], {"container": {"runtime": "none"}}, tmp_path, None) is None
