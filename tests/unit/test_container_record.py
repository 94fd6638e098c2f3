"""What ``environment.json`` records of a trial's container (``hpcsweep.container.record``), what an array
task is handed at submission (``hpcsweep.sweep.containers.record_for_tasks``), and where an OCI task works.
``tests/cluster/test_container_oci.py`` reads the same record from trials that ran in a real runtime."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from hpcsweep.container.record import (
    container_of,
    image_identity,
    parse_os_release,
    read_os_release,
    submitted_record,
    task_workdir,
)
from hpcsweep.container.settings import ContainerSettings
from hpcsweep.sweep.containers import RECORD_KEY, enter_task_workdir, record_for_tasks, record_of
from hpcsweep.sweep.hpcsweep_hook import HpcsweepTrials, task_container
from hpcsweep.trial.records import environment_record
from hpcsweep.trial.rendezvous import Rendezvous

DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'


def bundle(tmp_path: Path) -> Path:
    folder = tmp_path / "bundle"
    (folder / "rootfs").mkdir(parents=True)
    (folder / "config.json").write_text('{"ociVersion": "1.0.2"}')
    os.utime(folder / "config.json", (1_700_000_000, 1_700_000_000))
    return folder


def test_an_oci_bundle_is_known_by_its_config_json(tmp_path):
    folder = bundle(tmp_path)
    settings = ContainerSettings(runtime="oci", image="bundle")
    assert image_identity(settings, str(tmp_path)) == {"kind": "bundle", "path": str(folder), "config_json": {
        "size": 23, "mtime": "2023-11-14T22:13:20+00:00",
        "sha256": hashlib.sha256(b'{"ociVersion": "1.0.2"}').hexdigest()}}


def test_an_image_file_is_known_by_its_size_and_mtime_and_a_uri_by_its_text(tmp_path):
    sif = tmp_path / "img.sif"
    sif.write_bytes(b"x" * 10)
    os.utime(sif, (1_700_000_000, 1_700_000_000))
    assert image_identity(ContainerSettings(runtime="apptainer", image=str(sif)), "/") == {
        "kind": "file", "path": str(sif), "size": 10, "mtime": "2023-11-14T22:13:20+00:00"}
    uri = ContainerSettings(runtime="pyxis", image="nvcr.io#nvidia/pytorch:24.01-py3")
    assert image_identity(uri, "/") == {"kind": "uri", "uri": "nvcr.io#nvidia/pytorch:24.01-py3"}
    assert image_identity(ContainerSettings(), "/") is None


def test_a_submission_records_runtime_image_identity_and_where_its_tasks_work(tmp_path):
    bundle(tmp_path)
    record = submitted_record(ContainerSettings(runtime="oci", image="bundle"), str(tmp_path))
    assert (record["runtime"], record["image"], record["workdir"]) == ("oci", "bundle", str(tmp_path))
    assert record["identity"]["kind"] == "bundle"
    pyxis = submitted_record(ContainerSettings(runtime="pyxis", image="nvcr.io#x/y:1", workdir="/w"), str(tmp_path))
    assert pyxis["workdir"] == "/w"
    assert submitted_record(ContainerSettings(), str(tmp_path)) is None


def test_only_an_oci_task_changes_to_its_workdir_itself():
    # pyxis (--container-workdir) and Apptainer (--pwd) start the task there already.
    assert task_workdir({"runtime": "oci", "workdir": "/sub"}) == "/sub"
    assert task_workdir({"runtime": "pyxis", "workdir": "/sub"}) is None
    assert task_workdir(None) is None


def test_an_oci_task_enters_the_directory_the_sweep_was_submitted_from(tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    enter_task_workdir({RECORD_KEY: {"runtime": "oci", "workdir": str(tmp_path)}})
    assert Path.cwd() == tmp_path
    enter_task_workdir({})
    assert Path.cwd() == tmp_path


def test_the_tasks_are_handed_the_record_and_the_hook_gives_it_to_the_runner(tmp_path):
    bundle(tmp_path)
    params = {"timeout_min": 5, "container": {"runtime": "oci", "image": str(tmp_path / "bundle")}}
    handed = record_for_tasks(params, tmp_path)
    assert handed["timeout_min"] == 5 and record_of(handed)["runtime"] == "oci"
    assert record_of(record_for_tasks({"timeout_min": 5}, tmp_path)) is None
    assert task_container() is None
    with HpcsweepTrials().task_context(handed):
        assert task_container() == record_of(handed)
    assert task_container() is None


def test_an_image_gone_between_the_checks_and_the_submission_is_refused_naming_the_key(tmp_path):
    params = {"container": {"runtime": "oci", "image": str(tmp_path / "gone")}}
    with pytest.raises(ValueError, match=r"hydra.launcher.container.image='.*gone' is not allowed: it cannot be read"):
        record_for_tasks(params, tmp_path)


def test_os_release_keeps_the_name_id_and_version_unquoted():
    assert parse_os_release(DEBIAN) == {"PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)", "VERSION_ID": "12",
                                        "ID": "debian"}
    assert parse_os_release("") == {}
    assert read_os_release("/no/such/os-release") is None


def test_environment_json_says_what_ran_and_in_which_container():
    container = {"runtime": "oci", "image": "/b", "identity": {"kind": "bundle", "path": "/b"}, "workdir": "/w"}
    record = environment_record(Rendezvous("localhost", 29500, 1, 0, 1, "probe"), "none", {}, None, None, container)
    assert record["container"] == container
    assert record["python_executable"] == sys.executable
    assert record["os_release"] == parse_os_release(read_os_release() or "")
    assert environment_record(Rendezvous("localhost", 29500, 1, 0, 1, "probe"), "none", {}, None)["container"] is None


def test_a_model_card_names_the_image():
    assert container_of({"runtime": "oci", "image": "b", "identity": {"kind": "bundle", "path": "/s/b"}}) == \
        "oci image /s/b"
    assert container_of({"runtime": "pyxis", "image": "x", "identity": {"kind": "uri", "uri": "nvcr.io#x"}}) == \
        "pyxis image nvcr.io#x"
    assert container_of(None) is None


def test_the_export_card_names_the_image_and_what_ran_inside(tmp_path):
    import json

    from hpcsweep.export.model_card import CardFacts, model_card
    from hpcsweep.export.writer import _code_version

    container = {"runtime": "oci", "image": "bundle", "workdir": "/w", "identity": {
        "kind": "bundle", "path": "/s/bundle", "config_json": {"size": 3, "mtime": "2026", "sha256": "d9f7"}}}
    (tmp_path / "environment.json").write_text(json.dumps({
        "git_commit": "9d92563", "git_dirty": False, "code_snapshot": None, "container": container,
        "os_release": parse_os_release(DEBIAN), "python": "3.11.2"}))
    code = _code_version(tmp_path)
    facts = CardFacts(kind="full", sweep_dir="/s", trial_num=0, trial_dir="/s/0", overrides=[], metrics={},
                      checkpoint="c.pt", checkpoint_step=8, checkpoint_val_loss=None, base_model={},
                      base_model_path=None, model_config={}, code=code, files=[])
    assert ("- container: oci image `/s/bundle` (config.json sha256 `d9f7`), Debian GNU/Linux 12 (bookworm), "
            "Python 3.11.2 inside") in model_card(facts, "/out")
    (tmp_path / "environment.json").write_text(json.dumps({"git_commit": "9d92563", "container": None}))
    assert "container" not in _code_version(tmp_path)
