"""``python -m hpcsweep.export``: a LoRA trial as a peft adapter or a merged model, a full one as a model
folder, each loaded by ``from_pretrained`` in a fresh process with the trial's final logits; refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpcsweep import report
from hpcsweep.export import cli
from hpcsweep.export.source import choose_checkpoint, choose_source
from hpcsweep.export.weights import load_trial_model, trial_config
from hpcsweep.files.sweep_record import SweepRecord, TrialRecord, now_iso, write_sweep_record
from hpcsweep.train import worker as train
from hpcsweep.train.trackers.metrics import weights_sha256
from hpcsweep.train.checkpoint.trained_state import trained_state_dict

from .test_lora import LORA, SMALL
from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]

FRESH_LOAD = """
import sys, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
adapter, merged, full, batch_file, out = sys.argv[1:]
torch.set_num_threads(1)
batch = torch.load(batch_file)
def logits(model):
    with torch.no_grad():
        return model.eval()(input_ids=batch).logits
base_path = __import__("json").load(open(adapter + "/adapter_config.json"))["base_model_name_or_path"]
base = AutoModelForCausalLM.from_pretrained(base_path, local_files_only=True)
torch.save({
    "adapter": logits(PeftModel.from_pretrained(base, adapter, local_files_only=True)),
    "merged": logits(AutoModelForCausalLM.from_pretrained(merged, local_files_only=True)),
    "full": logits(AutoModelForCausalLM.from_pretrained(full, local_files_only=True)),
}, out)
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep of three trials: #0 LoRA, #1 full fine-tuning, #2 failed before its first checkpoint."""
    sweep_dir = tmp_path_factory.mktemp("export") / "sweep"
    settings = [(["model.peft=lora"], LORA), (["model.peft=none"], SMALL), (["model.peft=none", "trainer.seed=2"], SMALL)]
    trials = []
    for num, (overrides, values) in enumerate(settings):
        trial_dir = make_trial_dir(sweep_dir / str(num), values)
        if num < 2:
            assert train.run_trial(trial_dir) == 0
        else:
            (trial_dir / "metrics.json").write_text(json.dumps({"status": "failed", "step": 0}))
        trials.append(TrialRecord(num, overrides, str(trial_dir), None, now_iso()))
    write_sweep_record(SweepRecord(str(sweep_dir), "local", now_iso(), trials))
    return sweep_dir


def export(*args) -> int:
    return cli.main([str(a) for a in args])


@pytest.fixture(scope="module")
def exported(sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    assert export(sweep, "--trial", 0, "--checkpoint", "last", "--out", out / "adapter") == 0
    assert export(sweep, "--trial", 0, "--checkpoint", "last", "--merge", "--out", out / "merged") == 0
    assert export(sweep, "--trial", 1, "--checkpoint", "last", "--max-shard-size", "400KB", "--out", out / "full") == 0
    return out


def final_logits(trial_dir: Path, batch: torch.Tensor) -> torch.Tensor:
    """The trial's last checkpoint in a model, proved to be its final weights by metrics.json's hash."""
    net = load_trial_model(trial_config(trial_dir), max((trial_dir / "checkpoints").glob("step*.pt")))
    assert weights_sha256(trained_state_dict(net)) == read_metrics(trial_dir)["weights_sha256"]
    with torch.no_grad():
        return net(input_ids=batch).logits


def test_exports_load_in_a_fresh_process_with_the_trials_final_logits(sweep, exported, tmp_path):
    batch = torch.randint(0, 2048, (2, 24), generator=torch.Generator().manual_seed(0))
    torch.save(batch, tmp_path / "batch.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    folders = [exported / name for name in ("adapter", "merged", "full")]
    done = subprocess.run([sys.executable, "-c", FRESH_LOAD, *map(str, folders), str(tmp_path / "batch.pt"),
                           str(tmp_path / "logits.pt")], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = torch.load(tmp_path / "logits.pt")
    lora_final, full_final = final_logits(sweep / "0", batch), final_logits(sweep / "1", batch)
    assert (fresh["adapter"] - lora_final).abs().max() < 1e-5
    assert (fresh["merged"] - lora_final).abs().max() < 1e-5
    assert (fresh["full"] - full_final).abs().max() < 1e-5


def test_each_export_holds_the_files_that_the_ecosystem_loads_and_a_model_card(sweep, exported):
    adapter, merged, full = (exported / name for name in ("adapter", "merged", "full"))
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= {p.name for p in adapter.iterdir()}
    config = json.loads((adapter / "adapter_config.json").read_text())
    # The built-in base exists nowhere else: it goes along, and the adapter names it.
    assert config["base_model_name_or_path"] == str(adapter / "base")
    assert {"config.json", "model.safetensors", "generation_config.json"} <= {p.name for p in (adapter / "base").iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json"} <= {p.name for p in merged.iterdir()}
    assert not list(merged.glob("adapter_*"))
    # Above --max-shard-size the weights are sharded, with an index.
    assert (full / "model.safetensors.index.json").exists() and len(list(full.glob("model-*.safetensors"))) > 1
    card = (adapter / "README.md").read_text()
    metrics = read_metrics(sweep / "0")
    for text in ("# hpcsweep trial #0", f"- sweep: `{sweep}`", "- overrides: `model.peft=lora`", "code commit:",
                 f"| weights_sha256 | {metrics['weights_sha256']} |", "built from the config",
                 "PeftModel.from_pretrained", '"peft": "lora"'):
        assert text in card, text


def test_best_is_the_lowest_best_val_loss_and_its_lowest_checkpoint(sweep):
    best = min((0, 1), key=lambda n: read_metrics(sweep / str(n))["best_val_loss"])
    source = choose_source(sweep, None, "best")
    assert source.trial.num == best
    assert choose_checkpoint(["step00000004-val2.500000.pt", "step00000008-val2.600000.pt"], "best").startswith("step00000004")
    assert choose_checkpoint(["step00000004-val2.500000.pt", "step00000008-val2.600000.pt"], "last").startswith("step00000008")
    assert choose_checkpoint(["step00000004.pt", "step00000006.pt"], "best") == "step00000006.pt"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trial", "2"], "trial #2 has no checkpoint to export in "),
        (["--trial", "7"], "--trial 7: "),
        (["--trial", "1", "--merge"], "--merge is for a LoRA trial (model.peft=lora); trial #1 trained every weight"),
    ],
)
def test_refusals_are_one_line_and_write_nothing(sweep, tmp_path, capsys, args, message):
    assert export(sweep, *args, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m hpcsweep.export: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_an_out_dir_that_holds_files_is_refused(sweep, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    assert export(sweep, "--best", "--out", tmp_path / "out") == 2
    assert capsys.readouterr().err == (
        f"python -m hpcsweep.export: --out {tmp_path / 'out'} exists and is not empty: choose a new folder "
        "(an export never overwrites one)\n")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]


def test_report_prints_the_export_command_of_its_best_trial(sweep, capsys):
    assert report.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    best = min((0, 1), key=lambda n: read_metrics(sweep / str(n))["best_val_loss"])
    assert (f"export trial #{best} in Hugging Face format: python -m hpcsweep.export {sweep} --trial {best} "
            f"--out {sweep}/export-{best}") in out


def test_the_card_names_the_commit_a_slurm_trial_ran_from_its_code_snapshot():
    from hpcsweep.export.model_card import CardFacts, model_card

    facts = CardFacts(
        kind="merged", sweep_dir="/s", trial_num=3, trial_dir="/s/3", overrides=["model.lr=1e-4"], metrics={},
        checkpoint="step00000008.pt", checkpoint_step=8, checkpoint_val_loss=None,
        base_model={"path": "/shared/models/tiny", "config_sha256": "ab"}, base_model_path="/shared/models/tiny",
        model_config={"peft": "lora"}, code={"git_commit": "9d92563", "snapshot_diff_sha256": "e3b0", "hpcsweep": {
            "version": "0.1.0", "commit": "4379099", "dirty": True, "source": "git checkout /src/hpcsweep"}},
        files=["config.json", "README.md"],
    )
    card = model_card(facts, "/out")
    assert "- code commit: `9d92563` (the sweep's code snapshot; its uncommitted diff has sha256 e3b0)" in card
    assert "- hpcsweep: 0.1.0, commit `4379099` (git checkout /src/hpcsweep, with uncommitted changes)" in card
    assert '"path": "/shared/models/tiny"' in card and "Given as `/shared/models/tiny`; the adapter is merged into it here." in card
    assert "- checkpoint: `step00000008.pt` (step 8)" in card and "| val_loss | - |" in card


def test_the_card_names_the_hpcsweep_of_a_trial_run_from_a_data_folder(tmp_path):
    """'code commit: unknown (not run from a git checkout)' was all the card said of a sweep run from a
    data folder: the hpcsweep it ran (environment.json's ``hpcsweep``) has its own line."""
    from hpcsweep.export.model_card import _install_text
    from hpcsweep.export.writer import _code_version

    install = {"version": "0.1.0", "commit": "4379099", "dirty": False, "source": "git checkout /src/hpcsweep"}
    (tmp_path / "environment.json").write_text(json.dumps({"git_commit": None, "git_dirty": None,
                                                           "code_snapshot": None, "hpcsweep": install}))
    assert _code_version(tmp_path) == {"git_commit": None, "git_dirty": None, "hpcsweep": install}
    assert _install_text(install) == "0.1.0, commit `4379099` (git checkout /src/hpcsweep)"
    assert _install_text(None) == "unknown (the trial recorded no hpcsweep version)"
