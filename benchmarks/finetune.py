"""LoRA against full fine-tuning, on a tiny and a ~125M DeepSeek-style model saved with ``save_pretrained``.

    python benchmarks/finetune.py [--sizes tiny 125m] [--steps 4] [--workdir DIR] [--json FILE]

For each size it makes a model folder the way users bring one (``tests/model_folders.make_model_folder``:
``save_pretrained`` safetensors and a ``tokenizers``-trained tokenizer), then measures:
  - load time from disk: ``AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)``;
  - trainer tokens/s of the same model trained with ``model.peft=lora`` and ``model.peft=none``
    (``hpcsweep.train.worker.run_trial`` on a trial dir, metrics.json's ``tokens_per_s``);
  - each trial's checkpoint: its size, and the time to save it until durable (``Trainer.save``);
and prints LoRA's figures over full fine-tuning's, side by side.

The trials build the folder's architecture from its config.json (``model.*`` keys of the same sizes):
the speed and the checkpoint do not depend on where the weights came from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from gpu_check import checkpoint_times, folder_model_keys  # noqa: E402  (benchmarks/ is sys.path[0] as a script)

from hpcsweep.config import trial_config_from_dict, trial_config_to_dict  # noqa: E402
from hpcsweep.train.worker import EXIT_OK, run_trial  # noqa: E402
from tests.model_folders import make_model_folder  # noqa: E402

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {},  # tests/model_folders.TINY_DEEPSEEK
    # configs/model/deepseek_125m.yaml's shape; 16 layers stand in for its 32k vocabulary's embeddings,
    # which a tokenizer trained on the test corpus cannot reach.
    "125m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=16, num_attention_heads=12,
                 num_key_value_heads=12, max_position_embeddings=2048, n_routed_experts=8, num_experts_per_tok=2,
                 n_shared_experts=1, moe_intermediate_size=192, kv_lora_rank=256, qk_rope_head_dim=32,
                 qk_nope_head_dim=64, v_head_dim=64),
}
"""DeepseekV3Config overrides of each size's folder."""
def load_seconds(folder: Path) -> float:
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    return time.perf_counter() - start


def write_trial(path: Path, model: dict[str, Any], peft: str, steps: int) -> Path:
    cfg = trial_config_from_dict({
        "model": {**model, "peft": peft, "lora": {"r": 8}},
        "data": {"seq_len": 64, "batch_size": 2, "synthetic_tokens": 50_000},
        "trainer": {"device": "cpu", "max_steps": steps, "warmup_steps": 1, "log_every": steps,
                    "eval_every": steps, "eval_batches": 1, "ckpt_every": 0, "keep_top_k": 0},
    })
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(trial_config_to_dict(cfg), sort_keys=False))
    return path


def measure(size: str, workdir: Path, steps: int) -> dict[str, Any]:
    folder = make_model_folder(workdir / f"{size}-folder", **SIZES[size])
    model = folder_model_keys(folder)
    row: dict[str, Any] = {"size": size, "load_s": load_seconds(folder),
                           "parameters": sum(p.numel() for p in _meta_model(folder).parameters())}
    for peft in ("lora", "none"):
        trial = write_trial(workdir / f"{size}-{peft}", model, peft, steps)
        if run_trial(trial) != EXIT_OK:
            raise SystemExit(f"FAIL: {trial}: {json.loads((trial / 'metrics.json').read_text()).get('error')}")
        metrics = json.loads((trial / "metrics.json").read_text())
        times = checkpoint_times(trial)
        row[peft] = {"tokens_per_s": metrics["tokens_per_s"], "save_s": times["save_s"],
                     "checkpoint_mb": times["checkpoint_gb"] * 1e3}
    return row


def _meta_model(folder: Path) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder, local_files_only=True))


def report(rows: list[dict[str, Any]]) -> None:
    print(f"{'size':>6} {'params':>8} {'load':>7}   {'tokens/s LoRA / full':>22}   {'checkpoint MB LoRA / full':>26}"
          f"   {'save s LoRA / full':>20}")
    for r in rows:
        lo, fu = r["lora"], r["none"]
        print(f"{r['size']:>6} {r['parameters'] / 1e6:>7.1f}M {r['load_s']:>6.2f}s   "
              f"{lo['tokens_per_s']:>7.0f} / {fu['tokens_per_s']:<7.0f} x{lo['tokens_per_s'] / fu['tokens_per_s']:.2f}   "
              f"{lo['checkpoint_mb']:>8.2f} / {fu['checkpoint_mb']:<8.1f} x{lo['checkpoint_mb'] / fu['checkpoint_mb']:.3f}   "
              f"{lo['save_s']:>5.2f} / {fu['save_s']:<5.2f} x{lo['save_s'] / fu['save_s']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps of each trial (default: %(default)s)")
    parser.add_argument("--workdir", type=Path, help="where folders and trial dirs go (default: a temporary dir)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="finetune-") as tmp:
        rows = [measure(size, args.workdir or Path(tmp), args.steps) for size in args.sizes]
    report(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
