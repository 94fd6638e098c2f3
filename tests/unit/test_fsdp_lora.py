"""LoRA over a pretrained folder's frozen base, sharded with FSDP2 on 2 gloo ranks: the same adapters,
bit for bit, as the same trial under DDP, and ``export`` consolidates the sharded checkpoint."""

import os
import subprocess
import sys

from safetensors.torch import load_file

from tests.model_folders import make_model_folder, write_text_corpus

from .trial_dirs import read_metrics


def test_a_lora_trial_sharded_with_fsdp_trains_the_adapters_of_ddp_and_exports_them(tmp_path):
    folder = make_model_folder(tmp_path / "model")
    corpus = write_text_corpus(tmp_path / "corpus")
    trial = ["model=pretrained", f"model.path={folder}", "model.peft=lora", "model.lora.r=4", "model.lr=3e-3",
             "data=text", f"data.files={corpus}/*", "data.batch_size=4", "data.seq_len=32", "trainer.max_steps=6",
             "trainer.ckpt_every=6", "trainer.eval_every=6", "trainer.eval_batches=1", "trainer.warmup_steps=2",
             "trainer.nproc_per_node=2"]
    env = {**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf"}
    done = subprocess.run([sys.executable, "-m", "hpcsweep", "-m", "hydra/launcher=local", *trial,
                           "trainer.parallel=fsdp,ddp", "hydra.sweep.dir=sweep"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    fsdp, ddp = read_metrics(tmp_path / "sweep" / "0"), read_metrics(tmp_path / "sweep" / "1")
    assert (fsdp["status"], fsdp["parallel"], ddp["status"], ddp["parallel"]) == ("completed", "fsdp", "completed", "ddp")
    assert fsdp["weights_sha256"] == ddp["weights_sha256"]
    (checkpoint,) = (tmp_path / "sweep" / "0" / "checkpoints").glob("step*.pt")
    assert sorted(p.name for p in (checkpoint / "model").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

    adapters = []
    for num in (0, 1):
        out = tmp_path / f"adapter-{num}"
        exported = subprocess.run([sys.executable, "-m", "hpcsweep.export", "sweep", "--trial", str(num), "--out",
                                   str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert exported.returncode == 0, exported.stderr[-3000:]
        adapters.append(load_file(out / "adapter_model.safetensors"))
    sharded, replicated = adapters
    assert sharded.keys() == replicated.keys() and sharded
    assert all(sharded[key].equal(replicated[key]) for key in sharded)
