"""Trials in a container (``hydra.launcher.container``), as the login node writes them: each runtime's flags as
exact lists of strings, the mounts hpcsweep adds, the settings' refusals, and what the login node checks before
anything is queued (``hpcsweep.container``). What a sweep submits with: ``test_container_submit``.

The run inside a real runtime is not tested here (docs/user/containers.md says what is not built yet)."""

from __future__ import annotations

import os
import subprocess

import pytest

from hpcsweep.container.checks import check_local, check_on_login_node
from hpcsweep.container.flags import apptainer_setup, apptainer_words, container_launch, oci_flags, pyxis_flags
from hpcsweep.container.mounts import Mount, all_mounts, parse_mount, same_path_mounts
from hpcsweep.container.settings import ContainerSettings, container_settings

KEY = "hydra.launcher.container"
MOUNTS = [Mount("/s", "/s"), Mount("/data", "/data", "ro")]


# Each runtime's flags, golden


def test_pyxis_flags():
    assert pyxis_flags("/img/pt.sqsh", MOUNTS, "/work", ["NCCL_IB_HCA", "PYTHONPATH"]) == [
        "--container-image=/img/pt.sqsh",
        "--container-mounts=/s:/s,/data:/data:ro",
        "--container-workdir=/work",
        "--container-env=NCCL_IB_HCA,PYTHONPATH",
        "--no-container-mount-home",
    ]
    assert pyxis_flags("nvcr.io#nvidia/pytorch:24.05-py3", [], None, []) == [
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3", "--no-container-mount-home"]


def test_apptainer_command_and_setup():
    assert apptainer_words("/img/pt.sif", MOUNTS, "/work") == [
        "apptainer", "exec", "--nv", "-B", "/s:/s,/data:/data:ro", "--pwd", "/work", "/img/pt.sif"]
    assert "--cleanenv" not in apptainer_words("/img/pt.sif", MOUNTS, "/work")
    assert apptainer_setup(["NCCL_IB_HCA", "PYTHONPATH"]) == [
        'export APPTAINER_CACHEDIR="${APPTAINER_CACHEDIR:-${TMPDIR:-/tmp}/apptainer-cache-$(id -u)}"',
        'for name in NCCL_IB_HCA PYTHONPATH; do value="$(printenv "$name")" && export "APPTAINERENV_$name=$value"; done',
    ]


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_apptainer_setup_forces_what_is_set_and_leaves_the_rest_unset(shell):
    """Each forced variable set on the host becomes APPTAINERENV_NAME with its value, commas and all (which
    ``--env`` would split); one the host leaves unset stays unset, not empty."""
    script = "\n".join([*apptainer_setup(["NCCL_IB_HCA", "OMP_NUM_THREADS"]), "env"])
    env = {"PATH": os.environ["PATH"], "NCCL_IB_HCA": "=mlx5_0,mlx5_1", "TMPDIR": "/scratch"}
    out = subprocess.run([shell, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    lines = set(out.splitlines())
    assert "APPTAINERENV_NCCL_IB_HCA==mlx5_0,mlx5_1" in lines
    assert not any(line.startswith("APPTAINERENV_OMP_NUM_THREADS") for line in lines)
    assert f"APPTAINER_CACHEDIR=/scratch/apptainer-cache-{os.getuid()}" in lines


def test_oci_flags():
    assert oci_flags("/bundles/pt") == ["--container=/bundles/pt"]


# Mounts


def test_own_mounts_are_deduplicated_and_nested_ones_folded_into_their_parent():
    assert same_path_mounts(["/s/sweep/.code", "/s/sweep", "/m/model", "/s/sweep/", "/m/model2", "/c/cache"]) == [
        Mount("/c/cache", "/c/cache"), Mount("/m/model", "/m/model"), Mount("/m/model2", "/m/model2"),
        Mount("/s/sweep", "/s/sweep")]


def test_a_folder_is_mounted_before_what_lies_inside_it():
    user = [Mount("/data", "/data", "ro"), Mount("/x", "/m/model")]
    own = same_path_mounts(["/data/cache", "/m/model", "/s"])
    assert [m.text() for m in all_mounts(own, user)] == ["/data:/data:ro", "/s:/s", "/x:/m/model", "/data/cache:/data/cache"]


@pytest.mark.parametrize(
    "text", ["/data", "data:/data", "/data:data", "/data:/data:rx", "/a,b:/a", "/a:/b:ro:x", "/data:ro"])
def test_a_malformed_mount_is_refused_naming_its_entry(text):
    with pytest.raises(ValueError, match=rf"^{KEY}.mounts\[1\]='{text}' is not allowed: SRC:DST or SRC:DST:ro"):
        parse_mount(text, f"{KEY}.mounts[1]")
    with pytest.raises(ValueError, match=rf"^{KEY}.mounts\[0\]="):
        ContainerSettings(runtime="pyxis", image="/i.sqsh", mounts=[text])


# The settings' refusals (no file system)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"runtime": "docker"}, f"{KEY}.runtime='docker' is not allowed: one of none, pyxis, apptainer, oci"),
        ({"runtime": "pyxis"}, f"{KEY}.image=None is not allowed: the image to run with {KEY}.runtime=pyxis"),
        ({"runtime": "pyxis", "image": "nvcr.io/nvidia/pytorch:24.05-py3"},
         f"{KEY}.image='nvcr.io/nvidia/pytorch:24.05-py3' is not allowed: '#' separates the registry from the image "
         "in pyxis's URIs: nvcr.io#nvidia/pytorch:24.05-py3 (with '/', enroot looks for the image on Docker Hub, "
         "which answers 401)"),
        ({"runtime": "pyxis", "image": "docker://me@registry.local:5000/team/img:1"},
         f"{KEY}.image='docker://me@registry.local:5000/team/img:1' is not allowed: '#' separates the registry from "
         "the image in pyxis's URIs: docker://me@registry.local:5000#team/img:1"),
        ({"runtime": "apptainer", "image": "docker://nvcr.io/nvidia/pytorch:24.05-py3"},
         f"{KEY}.image='docker://nvcr.io/nvidia/pytorch:24.05-py3' is not allowed: a .sif file on shared storage, "
         "built once (apptainer build IMAGE.sif docker://nvcr.io/nvidia/pytorch:24.05-py3)"),
        ({"runtime": "oci", "image": "/b", "mounts": ["/d:/d"]},
         f"{KEY}.mounts=['/d:/d'] is not allowed: empty with runtime=oci: Slurm's OCI support takes mounts from the "
         "bundle's config.json"),
        ({"runtime": "oci", "image": "/b", "workdir": "/w"}, f"{KEY}.workdir='/w' is not allowed: null with runtime=oci"),
        ({"runtime": "pyxis", "image": "/i.sqsh", "workdir": "work"},
         f"{KEY}.workdir='work' is not allowed: an absolute path inside the container, or null"),
        ({"runtime": "pyxis", "image": "/i.sqsh", "env": ["NCCL_SOCKET_IFNAME", "1BAD"]},
         f"{KEY}.env[1]='1BAD' is not allowed: a variable name"),
        ({"runtime": "pyxis", "image": "/i.sqsh", "python": "python -u"}, f"{KEY}.python='python -u' is not allowed"),
        ({"image": "/i.sif"}, f"{KEY}.image='/i.sif' is not allowed: unset while {KEY}.runtime=none (no container)"),
        ({"runtime": "pyxis", "imgae": "/i.sqsh"}, f"{KEY}.imgae='/i.sqsh' is not allowed: a key of {KEY}: env, image,"),
        ({"runtime": "pyxis", "image": "/i.sqsh", "mounts": "/d:/d"}, f"{KEY}.mounts='/d:/d' is not allowed: a list"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(values, message):
    with pytest.raises(ValueError) as err:
        container_settings(values)
    assert str(err.value).startswith(message), str(err.value)


def test_good_settings_pass():
    assert container_settings(None) == ContainerSettings()
    for image in ("nvcr.io#nvidia/pytorch:24.05-py3", "nvidia/cuda:12.4.1-base-ubuntu22.04", "ubuntu",
                  "docker://nvcr.io#nvidia/pytorch:24.05-py3", "/shared/pt.sqsh", "images/pt.sqsh"):
        container_settings({"runtime": "pyxis", "image": image, "mounts": ["/d:/d:ro"], "env": ["NCCL_SOCKET_IFNAME"]})


# Refused before submit: what the login node can see


def test_the_image_and_mount_sources_must_be_readable_from_the_login_node(tmp_path):
    image = tmp_path / "pt.sqsh"
    settings = ContainerSettings(runtime="pyxis", image="pt.sqsh", mounts=[f"{tmp_path}/data:/data:ro"])
    with pytest.raises(ValueError, match=rf"^{KEY}.image='pt.sqsh' is not allowed: {image} does not exist \(the "
                                         "image must be on storage the login node and the nodes share\\)"):
        check_on_login_node(settings, str(tmp_path))
    image.write_bytes(b"hsqs")
    with pytest.raises(ValueError, match=rf"^{KEY}.mounts\[0\]='{tmp_path}/data:/data:ro' is not allowed: its source "
                                         f"{tmp_path}/data does not exist on this node"):
        check_on_login_node(settings, str(tmp_path))
    (tmp_path / "data").mkdir()
    check_on_login_node(settings, str(tmp_path))
    check_on_login_node(ContainerSettings(runtime="pyxis", image="nvcr.io#nvidia/pytorch:24.05-py3"), "/")
    if os.getuid() != 0:  # root reads anything
        image.chmod(0)
        with pytest.raises(ValueError, match="cannot be read from this node"):
            check_on_login_node(settings, str(tmp_path))


def test_an_oci_bundle_is_a_folder_with_its_config(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    with pytest.raises(ValueError, match="holds no readable config.json: not an OCI bundle"):
        check_on_login_node(ContainerSettings(runtime="oci", image=str(bundle)), "/")
    (bundle / "config.json").write_text("{}")
    check_on_login_node(ContainerSettings(runtime="oci", image=str(bundle)), "/")
    with pytest.raises(ValueError, match="is not a file: pyxis takes an enroot .sqsh file"):
        check_on_login_node(ContainerSettings(runtime="pyxis", image=str(bundle)), "/")


def test_a_local_sweep_refuses_every_runtime_and_says_why():
    found = {"apptainer": "/usr/bin/apptainer", "enroot": "/usr/bin/enroot", "runc": "/usr/bin/runc"}.get
    nothing = {}.get
    check_local(ContainerSettings(), nothing)
    head = "is not allowed here: no Slurm controller answered, so the trials would run on this machine, and "
    cases = [
        ("apptainer", nothing, "apptainer is not installed here (not on PATH)"),
        ("apptainer", found, "running a local sweep's trials in Apptainer is not built yet"),
        ("pyxis", nothing, "pyxis is a plugin of Slurm's srun (enroot is not installed here either)"),
        ("pyxis", found, "pyxis is a plugin of Slurm's srun;"),
        ("oci", nothing, "Slurm's OCI support runs through srun (runc is not installed here either)"),
    ]
    for runtime, which, why in cases:
        with pytest.raises(ValueError) as err:
            check_local(ContainerSettings(runtime=runtime, image="/i"), which)
        assert str(err.value).startswith(f"{KEY}.runtime={runtime!r} {head}{why}"), str(err.value)
        assert str(err.value).endswith(f"or set {KEY}.runtime=none")


def test_a_path_no_runtime_can_mount_is_refused():
    settings = ContainerSettings(runtime="pyxis", image="/i.sqsh")
    with pytest.raises(ValueError, match=r"^model.path='/m/a,b' is not allowed with hydra.launcher.container.runtime="
                                         "pyxis: it is mounted at the same path inside, and mounts cannot hold a comma"):
        container_launch(settings, [("the sweep dir", "/s"), ("model.path", "/m/a,b")], [], "/")
