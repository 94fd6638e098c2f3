"""Exports that travel (#31 items 6 and 7, #30 item 6): an adapter names its base as the user typed it
and loads over a copy of the base elsewhere; a bf16 base exports in its own dtypes; tokenizer and remote
code files are copied byte for byte; a sweep still running is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from hpcsweep.export import cli
from hpcsweep.export.base_files import auto_map_modules, files_to_copy
from hpcsweep.export.dtypes import cast_model, export_dtypes, header_dtypes
from hpcsweep.export.source import running_refusal
from hpcsweep.export.weights import load_trial_model, trial_config
from hpcsweep.files.sweep_record import SweepRecord, TrialRecord, now_iso, write_sweep_record
from hpcsweep.train import worker as train
from hpcsweep.train.trackers.metrics import weights_sha256
from hpcsweep.train.checkpoint.trained_state import trained_state_dict
from tests.export_folders import make_bf16_folder, make_remote_code_folder

from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)
TYPED = "models/tiny-bf16"
"""``model.path`` as the user typed it, relative to the folder the sweep was started from."""
TRIAL = {
    "data.batch_size": 2, "data.seq_len": 16, "data.synthetic_tokens": 5000, "trainer.device": "cpu",
    "trainer.max_steps": 2, "trainer.warmup_steps": 1, "trainer.eval_every": 2, "trainer.eval_batches": 1,
    "trainer.log_every": 1, "trainer.ckpt_every": 0, "model.lora.r": 2,
}
BATCH = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))

LOAD_ELSEWHERE = """
import json, sys, warnings, logging, torch
adapter, merged, full, batch_file, out = sys.argv[1:]
torch.set_num_threads(1)
messages = []
class Keep(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            messages.append(record.getMessage())
logging.getLogger().addHandler(Keep())
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.get_logger().addHandler(Keep())
    batch = torch.load(batch_file)
    def logits(model):
        with torch.no_grad():
            return model.eval()(input_ids=batch).logits.float()
    with open(adapter + "/adapter_config.json") as f:
        base_path = json.load(f)["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_path, local_files_only=True, dtype=torch.float32)
    result = {"adapter": logits(PeftModel.from_pretrained(base, adapter, local_files_only=True))}
    result["merged"] = logits(AutoModelForCausalLM.from_pretrained(merged, local_files_only=True))
    result["full"] = logits(AutoModelForCausalLM.from_pretrained(full, local_files_only=True))
    result["full_dtype"] = str(AutoModelForCausalLM.from_pretrained(full, local_files_only=True).dtype)
    for name, folder in (("merged", merged), ("full", full)):
        result[name + "_fp32"] = logits(AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                                             dtype=torch.float32))
messages += [str(w.message) for w in caught]
result["warnings"] = messages
torch.save(result, out)
"""


@contextmanager
def working_dir(path: Path):
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def final_logits(trial_dir: Path, base: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The trial's final model (proved by metrics.json's hash) on ``BATCH``, as it computed in fp32, and
    with each weight rounded to its dtype in ``base`` (a LoRA model merged first)."""
    net = load_trial_model(trial_config(trial_dir), max((trial_dir / "checkpoints").glob("step*.pt")))
    assert weights_sha256(trained_state_dict(net)) == read_metrics(trial_dir)["weights_sha256"]
    with torch.no_grad():
        fp32 = net(input_ids=BATCH).logits
        plain = net.merge_and_unload() if hasattr(net, "merge_and_unload") else net
        names = [name for name, _ in [*plain.named_parameters(), *plain.named_buffers()]]
        cast_model(plain, export_dtypes(names, header_dtypes(base), "bfloat16", None, []))
        return fp32, plain(input_ids=BATCH).logits.float()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A user's folder holding a bf16 model and a sweep started from there: #0 LoRA and #1 full fine-tuning
    of ``model.path=models/tiny-bf16`` (as typed), with each trial's final logits."""
    root = tmp_path_factory.mktemp("project")
    make_bf16_folder(root / TYPED)
    sweep_dir = root / "multirun" / "sweep"
    trials, logits = [], {}
    with working_dir(root):
        for num, peft in enumerate(("lora", "none")):
            trial_dir = make_trial_dir(sweep_dir / str(num), {**TRIAL, "model.path": TYPED, "model.peft": peft})
            assert train.run_trial(trial_dir) == 0
            trials.append(TrialRecord(num, [f"model.peft={peft}"], str(trial_dir), None, now_iso()))
            logits[num] = final_logits(trial_dir, root / TYPED)
    write_sweep_record(SweepRecord(str(sweep_dir), "local", now_iso(), trials))
    return root, sweep_dir, logits


def export(*args) -> int:
    return cli.main([str(a) for a in args])


@pytest.fixture(scope="module")
def exported(project, tmp_path_factory):
    """The three exports, written from another folder than the one the sweep was started from."""
    _, sweep_dir, _ = project
    out = tmp_path_factory.mktemp("exports")
    with working_dir(out):
        assert export(sweep_dir, "--trial", 0, "--out", "adapter") == 0
        assert export(sweep_dir, "--trial", 0, "--merge", "--out", "merged") == 0
        assert export(sweep_dir, "--trial", 1, "--out", "full") == 0
    return out


def test_an_adapter_names_its_base_as_typed_and_loads_over_a_copy_of_it_elsewhere(project, exported, tmp_path):
    root, _, logits = project
    adapter_config = json.loads((exported / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == TYPED
    card = (exported / "adapter" / "README.md").read_text()
    assert f'AutoModelForCausalLM.from_pretrained("{TYPED}", local_files_only=True)' in card
    assert "### On another machine" in card and "set it to the base's path" in card

    # Another machine: the base folder at another path, the adapter pointed there.
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(root / TYPED, elsewhere / "base")
    shutil.copytree(exported / "adapter", elsewhere / "adapter")
    adapter_config["base_model_name_or_path"] = str(elsewhere / "base")
    (elsewhere / "adapter" / "adapter_config.json").write_text(json.dumps(adapter_config))
    torch.save(BATCH, tmp_path / "batch.pt")
    folders = [elsewhere / "adapter", exported / "merged", exported / "full"]
    done = subprocess.run([sys.executable, "-c", LOAD_ELSEWHERE, *map(str, folders), str(tmp_path / "batch.pt"),
                           str(tmp_path / "out.pt")], env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=elsewhere,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = torch.load(tmp_path / "out.pt")
    assert (fresh["adapter"] - logits[0][0]).abs().max() < 1e-5
    # One warning comes from the libraries themselves, whatever the adapter holds: peft calls a transformers
    # method that transformers 5 deprecates. Any other warning fails (no rank_pattern key matching nothing:
    # expert LoRA adapts the fused experts at the adapter's own rank).
    library = ("`is_gradient_checkpointing` is deprecated",)
    assert [w for w in fresh["warnings"] if not any(known in w for known in library)] == []
    assert "rank_pattern" not in adapter_config or not adapter_config["rank_pattern"]

    # A bf16 base: full and merged models come back in bf16 with the logits of the trial's weights rounded
    # to bf16 (the router kept in fp32), computed in bf16, to a few bf16 ulps (2**-8 relative; the loaded
    # model's attention kernel differs); loaded in fp32, the trial's own logits to the weights' rounding.
    assert fresh["full_dtype"] == "torch.bfloat16"
    for name, num in (("merged", 0), ("full", 1)):
        fp32, rounded = logits[num]
        assert (fresh[name] - rounded).abs().max() < 2**-6 * rounded.abs().max(), name
        relative = ((fresh[name + "_fp32"] - fp32).norm() / fp32.norm()).item()
        assert relative < 2 * 2**-8, (name, relative)


def test_a_bf16_base_exports_each_tensor_in_the_bases_own_dtype(project, exported, tmp_path):
    root, sweep_dir, _ = project
    base = header_dtypes(root / TYPED)
    assert base["model.layers.1.mlp.gate.weight"] == "float32"  # the router, kept in fp32 by transformers
    assert base["model.layers.1.mlp.gate.e_score_correction_bias"] == "float32"
    assert base["model.embed_tokens.weight"] == "bfloat16"
    # Bit for bit the trial's weights, each rounded to its dtype in the base (transformers saves the fused
    # experts per expert, under other names: those are bf16 as the folder's dtype says).
    with working_dir(root):
        trial = load_trial_model(trial_config(sweep_dir / "1"), max((sweep_dir / "1" / "checkpoints").glob("step*")))
    from transformers import AutoModelForCausalLM

    written = AutoModelForCausalLM.from_pretrained(exported / "full", local_files_only=True).state_dict()
    for key, tensor in trial.state_dict().items():
        assert torch.equal(written[key], tensor.to(getattr(torch, base.get(key, "bfloat16")))), key
    for name in ("merged", "full"):
        assert header_dtypes(exported / name) == base, name
        config = json.loads((exported / name / "config.json").read_text())
        assert config["dtype"] == config["torch_dtype"] == "bfloat16", name
    assert export(sweep_dir, "--trial", 1, "--dtype", "fp32", "--out", tmp_path / "fp32") == 0
    assert set(header_dtypes(tmp_path / "fp32").values()) == {"float32"}
    assert json.loads((tmp_path / "fp32" / "config.json").read_text())["torch_dtype"] == "float32"


def test_dtype_choice_keeps_fp32_modules_when_casting_to_a_half_dtype():
    names = ["model.embed_tokens.weight", "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate_proj.weight"]
    keep = ["e_score_correction_bias", "gate.weight"]
    assert export_dtypes(names, {}, "bfloat16", "float16", keep) == {
        names[0]: "float16", names[1]: "float32", names[2]: "float16"}
    assert export_dtypes(names, {names[0]: "bfloat16"}, "bfloat16", None, keep) == {
        names[0]: "bfloat16", names[1]: "float32", names[2]: "bfloat16"}
    assert set(export_dtypes(names, {}, "float32", None, keep).values()) == {"float32"}


def test_the_tokenizer_files_are_copied_byte_for_byte(project, exported):
    root, _, _ = project
    for name in ("tokenizer.json", "tokenizer_config.json"):
        for export_dir in ("adapter", "merged", "full"):
            assert (exported / export_dir / name).read_bytes() == (root / TYPED / name).read_bytes(), export_dir


def test_dtype_for_an_adapter_over_a_folder_is_refused(project, tmp_path, capsys):
    _, sweep_dir, _ = project
    assert export(sweep_dir, "--trial", 0, "--dtype", "bf16", "--out", tmp_path / "a") == 2
    assert capsys.readouterr().err.startswith("python -m hpcsweep.export: --dtype is for a model's weights")
    assert not (tmp_path / "a").exists() and not list(tmp_path.glob(".a.tmp-*"))


def test_base_name_names_the_base_as_given(project, tmp_path):
    _, sweep_dir, _ = project
    name = "deepseek-ai/deepseek-moe-16b-base"
    assert export(sweep_dir, "--trial", 0, "--base-name", name, "--out", tmp_path / "a") == 0
    assert json.loads((tmp_path / "a" / "adapter_config.json").read_text())["base_model_name_or_path"] == name
    assert f'from_pretrained("{name}", local_files_only=True)' in (tmp_path / "a" / "README.md").read_text()
    assert export(sweep_dir, "--trial", 0, "--merge", "--base-name", name, "--out", tmp_path / "m") == 0
    assert f"Given as `{name}`; the adapter is merged into it here." in (tmp_path / "m" / "README.md").read_text()


def test_remote_code_is_copied_and_trusted_for_every_load(tmp_path):
    folder = make_remote_code_folder(tmp_path / "models" / "remote")
    assert auto_map_modules({"AutoTokenizer": ["tok_x.Slow", None], "AutoModel": "org/repo--modeling_y.M"}) == [
        "modeling_y.py", "tok_x.py"]
    assert files_to_copy(folder, model_code=True) == [
        "tokenizer.json", "tokenizer_config.json", "configuration_tiny_remote.py", "modeling_tiny_remote.py"]
    assert files_to_copy(folder, model_code=False) == ["tokenizer.json", "tokenizer_config.json"]
    sweep_dir = tmp_path / "sweep"
    settings = {**TRIAL, "model.path": str(folder), "model.trust_remote_code": True, "model.peft": "none"}
    trial_dir = make_trial_dir(sweep_dir / "0", settings)
    assert train.run_trial(trial_dir) == 0
    write_sweep_record(SweepRecord(str(sweep_dir), "local", now_iso(),
                                   [TrialRecord(0, [], str(trial_dir), None, now_iso())]))
    assert export(sweep_dir, "--trial", 0, "--out", tmp_path / "out") == 0
    for name in ("configuration_tiny_remote.py", "modeling_tiny_remote.py", "tokenizer.json"):
        assert (tmp_path / "out" / name).read_bytes() == (folder / name).read_bytes(), name
    card = (tmp_path / "out" / "README.md").read_text()
    assert 'from_pretrained("' in card and "local_files_only=True, trust_remote_code=True)" in card
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True, trust_remote_code=True)
    assert type(loaded).__name__ == "TinyRemoteForCausalLM"


def test_a_running_sweep_is_refused_naming_its_trials_unless_a_finished_trial_or_allow_running(
        project, tmp_path, capsys):
    _, sweep_dir, _ = project
    running = tmp_path / "running"
    shutil.copytree(sweep_dir, running)
    record = json.loads((running / "sweep.json").read_text())
    for trial in record["trials"]:
        trial["trial_dir"] = str(running / str(trial["num"]))
    (running / "sweep.json").write_text(json.dumps(record))
    metrics = read_metrics(running / "0")
    (running / "0" / "metrics.json").write_text(json.dumps({**metrics, "status": "running", "max_steps": 400}))

    assert export(running, "--best", "--out", tmp_path / "a") == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m hpcsweep.export: the sweep has not finished (trials #0 running): its best "
                          "trial may change; wait") and "--allow-running" in err and err.count("\n") == 1, err
    assert export(running, "--trial", 0, "--out", tmp_path / "b") == 2
    assert "trial #0 has not finished (#0 running)" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()

    assert export(running, "--trial", 1, "--out", tmp_path / "c") == 0  # finished: allowed
    assert export(running, "--trial", 0, "--allow-running", "--out", tmp_path / "d") == 0
    err = capsys.readouterr().err
    assert "trial #0 is running: exported its checkpoint step00000002" in err and "(step 2 of 400)" in err, err


def test_the_running_refusal_is_a_pure_decision_on_the_statuses():
    statuses = {0: "completed", 1: "pending", 2: "running"}
    assert "trials #1 pending, #2 running" in running_refusal(statuses, None, Path("S"))
    assert running_refusal(statuses, 0, Path("S")) is None
    assert "trial #1 has not finished (#1 pending)" in running_refusal(statuses, 1, Path("S"))
    assert running_refusal({0: "completed", 1: "failed", 2: "cancelled"}, None, Path("S")) is None
