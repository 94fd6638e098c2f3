"""LoRA over a pretrained folder's frozen base, sharded with FSDP2 on 2 gloo ranks: the same adapters,
bit for bit, as the same trial under DDP, and ``export`` consolidates the sharded checkpoint.

Bit for bit holds where the gradient norm clips nothing: FSDP sums each shard's squares and then the ranks',
DDP each whole gradient's, so the norm agrees only to rounding, and a clipped step scales every gradient by
it. With clipping active the adapters agree to float32 rounding (seed 0 clips at step 6 and differed by
2e-8 at most when this was written)."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import torch
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
                           "trainer.parallel=fsdp,ddp", "trainer.grad_clip=0,1.0", "hydra.sweep.dir=sweep"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Hydra's sweep order: parallel varies slowest, so 0/1 are FSDP without/with clipping, 2/3 DDP.
    fsdp, fsdp_clipped, ddp, ddp_clipped = (read_metrics(tmp_path / "sweep" / str(num)) for num in range(4))
    assert [(m["status"], m["parallel"]) for m in (fsdp, fsdp_clipped, ddp, ddp_clipped)] == [
        ("completed", "fsdp"), ("completed", "fsdp"), ("completed", "ddp"), ("completed", "ddp")]
    assert fsdp["weights_sha256"] == ddp["weights_sha256"]
    assert max(fsdp_clipped["grad_norm"], ddp_clipped["grad_norm"]) > 1.0  # the clipped pair did clip
    (checkpoint,) = (tmp_path / "sweep" / "0" / "checkpoints").glob("step*.pt")
    assert sorted(p.name for p in (checkpoint / "model").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

    # The four exports read their own trial's checkpoint and write their own folder: two at a time, so
    # that one's import of torch and transformers overlaps the other's work.
    def export(num):
        out = tmp_path / f"adapter-{num}"
        exported = subprocess.run([sys.executable, "-m", "hpcsweep.export", "sweep", "--trial", str(num), "--out",
                                   str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert exported.returncode == 0, exported.stderr[-3000:]
        return load_file(out / "adapter_model.safetensors")

    with ThreadPoolExecutor(max_workers=2) as pool:
        adapters = list(pool.map(export, (0, 2, 1, 3)))
    sharded, replicated, sharded_clipped, replicated_clipped = adapters
    assert sharded.keys() == replicated.keys() and sharded
    assert all(sharded[key].equal(replicated[key]) for key in sharded)
    assert sharded_clipped.keys() == replicated_clipped.keys() == sharded.keys()
    assert all(torch.allclose(sharded_clipped[key], replicated_clipped[key], rtol=0, atol=1e-6) for key in sharded)
    assert not all(sharded_clipped[key].equal(sharded[key]) for key in sharded)  # clipping changed the run
