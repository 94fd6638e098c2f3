"""LoRA against full fine-tuning on DeepSeek-style models saved with ``save_pretrained``: speed and training state.

    python benchmarks/finetune.py [--shape moe moe64 moe256] [--steps 8] [--rank 8] [--workdir DIR] [--json FILE]
    python benchmarks/finetune.py --checkpoints [--shape tiny 125m] [--steps 4]
    python benchmarks/finetune.py --experts [--steps 12]

For each shape it makes a model folder the way users bring one (``tests/model_folders.make_model_folder``:
``save_pretrained`` safetensors and a ``tokenizers``-trained tokenizer), loads it three times (``hpcsweep.train.model``)
and trains the copies side by side in this one process, on CPU with one thread, the same batches (2 x 64):

- **LoRA** (``hpcsweep.train.lora.apply_lora``, ``model.lora.r`` = ``--rank``, routed experts included),
  **full fine-tuning**, and for reference the same LoRA run by peft's own ``ParamWrapper`` forward (its fold
  ``W + s·B·A`` of the expert tensors), each with the trainer's AdamW (``hpcsweep.train.optim.build_optimizer``);
- the contenders alternate step by step (their order reverses every other step), each step timed in CPU time
  (``time.process_time``: forward, backward, optimizer step), and each contender's first step is left out;
  tokens/s is the batch's tokens over the mean of the other steps;
- **training-state memory**, computed from the tensors: the parameters that train, their gradients and the
  optimizer's state (bytes of every tensor in ``optimizer.state``), and for LoRA the expert LoRA's temporaries:
  the tensors autograd saves for the backward of the experts' adapter products (``expert_lora.ExpertFactors``)
  during one forward (the adapter weights copied into the grouped GEMMs' layout among them), counted once per
  storage, parameters' storages left out. All counted as if held at once.

The shapes ``moe64`` and ``moe256`` keep the routed and shared expert counts, top-k, expert groups and width
ratios of DeepSeek-V2-Lite and DeepSeek-V3, shrunk in width and depth (``SHAPES``); ``moe`` has 16 experts.

It ends with ``LoRA/full tokens/s X.XX, training-state memory X.XX`` (LoRA's figure over full fine-tuning's)
for the last shape. ``--checkpoints`` instead trains each shape as a trial (``hpcsweep.train.worker.run_trial``)
with ``model.peft=lora`` and ``none`` and reports load time, checkpoint size and save time. ``--experts`` times
the routed experts alone (``EXPERT_SHAPES``: 8, 64 and 256 experts): forward and backward of ``MICRO_TOKENS``
tokens through a model of two MoE layers, no optimizer, medians of CPU time, contenders alternating likewise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import yaml
from peft.tuners.lora import ParamWrapper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from gpu_check import checkpoint_times, folder_model_keys  # noqa: E402  (benchmarks/ is sys.path[0] as a script)

from hpcsweep.config import trial_config_from_dict, trial_config_to_dict  # noqa: E402
from hpcsweep.train import lora, optim  # noqa: E402
from hpcsweep.train.moe import expert_lora  # noqa: E402
from hpcsweep.train import model as model_lib  # noqa: E402
from hpcsweep.train.worker import EXIT_OK, run_trial  # noqa: E402
from tests.model_folders import make_model_folder  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {},  # tests/model_folders.TINY_DEEPSEEK
    # configs/model/deepseek_125m.yaml's shape; 16 layers stand in for its 32k vocabulary's embeddings,
    # which a tokenizer trained on the test corpus cannot reach.
    "125m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=16, num_attention_heads=12,
                 num_key_value_heads=12, max_position_embeddings=2048, n_routed_experts=8, num_experts_per_tok=2,
                 n_shared_experts=1, moe_intermediate_size=192, kv_lora_rank=256, qk_rope_head_dim=32,
                 qk_nope_head_dim=64, v_head_dim=64),
    # A 28.7M DeepSeek-V3 MoE: hidden 512, 4 layers (one dense, three MoE), 16 routed experts, top-4, one shared.
    "moe": dict(hidden_size=512, intermediate_size=1472, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=8, max_position_embeddings=256, n_routed_experts=16, num_experts_per_tok=4,
                n_shared_experts=1, moe_intermediate_size=288, kv_lora_rank=128, qk_rope_head_dim=32,
                qk_nope_head_dim=64, v_head_dim=64),
    # DeepSeek-V2-Lite's MoE (64 routed experts, 2 shared, top-6, no expert groups, one dense layer first, no
    # low-rank queries, moe_intermediate / hidden = 1408 / 2048 and intermediate / hidden = 10944 / 2048), at
    # hidden 256 (1/8 of its widths), 4 layers, attention 4 heads of 32/16/32 dims, on DeepseekV3's classes
    # (make_model_folder's: its router is V3's sigmoid one where V2-Lite's is a softmax); 28.5M parameters.
    "moe64": dict(hidden_size=256, moe_intermediate_size=176, intermediate_size=1368, num_hidden_layers=4,
                  first_k_dense_replace=1, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
                  n_group=1, topk_group=1, q_lora_rank=None, kv_lora_rank=64, num_attention_heads=4,
                  num_key_value_heads=4, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32),
    # DeepSeek-V3's MoE (256 routed experts, 1 shared, top-8 within the top 4 of 8 expert groups, dense layers
    # first), every width at 1/32 of V3's (hidden 224, moe_intermediate 64, intermediate 576, q_lora_rank 48,
    # kv_lora_rank 16), 4 layers; 34.1M parameters. (At 1/16, hidden 448, it is 135.5M and the benchmark holds
    # 5.9 GB: too much beside four other engineers on this machine.)
    "moe256": dict(hidden_size=224, moe_intermediate_size=64, intermediate_size=576, num_hidden_layers=4,
                   first_k_dense_replace=1, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
                   n_group=8, topk_group=4, q_lora_rank=48, kv_lora_rank=16, num_attention_heads=4,
                   num_key_value_heads=4, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32),
}
"""DeepseekV3Config overrides of each shape's folder."""
BATCH, SEQ = 2, 64


@dataclass
class Contender:
    name: str
    net: torch.nn.Module
    optimizer: torch.optim.Optimizer
    seconds: list[float]


def contenders(folder: Path, rank: int) -> list[Contender]:
    """LoRA and full fine-tuning of the same folder, each with the trainer's optimizer."""
    made = []
    for name, peft in (("LoRA", "lora"), ("full", "none"), ("LoRA, peft's fold", "lora")):
        cfg = trial_config_from_dict({"model": {"path": str(folder), "peft": peft, "lora": {"r": rank}}})
        net = lora.apply_lora(model_lib.build_model(cfg.model, seed=0), cfg.model, seed=0).train()
        if name == "LoRA, peft's fold":
            _as_peft_forward(net)
        made.append(Contender(name, net, optim.build_optimizer(net, cfg.model, cfg.trainer), []))
    return made


def train_step(contender: Contender, batch: torch.Tensor) -> None:
    """One step of the trainer's kind: next-token cross-entropy, backward, optimizer step; its CPU seconds kept."""
    start = time.process_time()
    logits = contender.net(input_ids=batch[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    loss.backward()
    contender.optimizer.step()
    contender.optimizer.zero_grad(set_to_none=True)
    contender.seconds.append(time.process_time() - start)


def training_state_bytes(contender: Contender, batch: torch.Tensor) -> dict[str, int]:
    """Bytes of the parameters that train, their gradients, the optimizer state, and the expert LoRA's
    temporaries of one forward (0 without expert LoRA)."""
    net = contender.net
    trained = [p for p in net.parameters() if p.requires_grad]
    with expert_lora_saves(net) as saved:
        loss = net(input_ids=batch[:, :-1]).logits.float().square().mean()
    loss.backward()
    state = {
        "parameters": sum(p.numel() * p.element_size() for p in trained),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in trained if p.grad is not None),
        "optimizer": sum(t.numel() * t.element_size() for s in contender.optimizer.state.values()
                         for t in s.values() if isinstance(t, torch.Tensor)),
        "expert_lora_temporaries": sum(saved.values()),
    }
    net.zero_grad(set_to_none=True)
    return state


@contextmanager
def expert_lora_saves(net: torch.nn.Module) -> Iterator[dict[int, int]]:
    """``{storage address: bytes}`` of what autograd saves inside ``expert_lora.ExpertFactors`` while in the block,
    parameters' storages left out."""
    parameters = {p.untyped_storage().data_ptr() for p in net.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    plain = expert_lora.ExpertFactors.__call__

    def counted(self: expert_lora.ExpertFactors, x: torch.Tensor, groups: expert_lora.Groups) -> torch.Tensor:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            return plain(self, x, groups)

    expert_lora.ExpertFactors.__call__ = counted
    try:
        yield saved
    finally:
        expert_lora.ExpertFactors.__call__ = plain


def measure_speed(shape: str, workdir: Path, steps: int, rank: int) -> dict[str, Any]:
    folder = make_model_folder(workdir / f"{shape}-folder", **SHAPES[shape])
    runners = contenders(folder, rank)
    vocab = runners[0].net.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, vocab, (BATCH, SEQ + 1), generator=generator) for _ in range(steps)]
    for step, batch in enumerate(batches):
        for contender in (runners if step % 2 == 0 else runners[::-1]):
            train_step(contender, batch)
    row: dict[str, Any] = {"shape": shape, "steps": steps, "rank": rank, "load_average": os.getloadavg()[0],
                           "parameters": sum(p.numel() for p in runners[1].net.parameters())}
    for contender in runners:
        timed = contender.seconds[1:]  # the first step of each is left out
        row[contender.name] = {"tokens_per_s": BATCH * SEQ / statistics.mean(timed), "step_s": timed}
        if contender.name in ("LoRA", "full"):
            memory = training_state_bytes(contender, batches[0])
            row[contender.name].update(memory=memory, memory_total=sum(memory.values()))
    return row


def report_speed(rows: list[dict[str, Any]]) -> None:
    print(f"{'shape':>6} {'params':>8}   {'tokens/s LoRA / full':>24}   {'training state MiB LoRA / full':>31}"
          f"   {'LoRA expert temporaries MiB':>27}   {'tokens/s LoRA with peft fold':>28}")
    for r in rows:
        lo, fu, fold = r["LoRA"], r["full"], r["LoRA, peft's fold"]
        print(f"{r['shape']:>6} {r['parameters'] / 1e6:>7.1f}M   "
              f"{lo['tokens_per_s']:>7.0f} / {fu['tokens_per_s']:<7.0f} x{lo['tokens_per_s'] / fu['tokens_per_s']:.2f}   "
              f"{lo['memory_total'] / 2**20:>9.2f} / {fu['memory_total'] / 2**20:<9.1f} "
              f"x{lo['memory_total'] / fu['memory_total']:.3f}   "
              f"{lo['memory']['expert_lora_temporaries'] / 2**20:>27.2f}   "
              f"{fold['tokens_per_s']:>11.0f} x{fold['tokens_per_s'] / fu['tokens_per_s']:.2f} of full")
    last = rows[-1]
    print(f"LoRA/full tokens/s {last['LoRA']['tokens_per_s'] / last['full']['tokens_per_s']:.2f}, "
          f"training-state memory {last['LoRA']['memory_total'] / last['full']['memory_total']:.2f}")


MICRO_TOKENS = 512
EXPERT_SHAPES: dict[str, dict[str, Any]] = {
    name: {**dict(hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2, first_k_dense_replace=0,
                  num_experts_per_tok=2, n_group=1, topk_group=1), **sizes}
    for name, sizes in {
        "8": dict(n_routed_experts=8),
        "64": dict(n_routed_experts=64),
        "256": dict(n_routed_experts=256),
        "64, hidden 256": dict(n_routed_experts=64, hidden_size=256, moe_intermediate_size=128),
    }.items()
}
"""``--experts``: DeepseekV3Config size overrides (tests/model_folders.TINY_DEEPSEEK's attention) of a model whose
two layers are both MoE, top-2, by its routed experts; the issue's micro-benchmark (issue 39)."""


def measure_experts(name: str, steps: int, rank: int) -> dict[str, Any]:
    """Forward and backward (no optimizer) of ``MICRO_TOKENS`` tokens through full fine-tuning, LoRA and LoRA with
    peft's fold, alternating, in CPU time; each contender's first step left out."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from tests.model_folders import TINY_DEEPSEEK

    config = DeepseekV3Config(vocab_size=384, **{**TINY_DEEPSEEK, **EXPERT_SHAPES[name]})
    cfg = trial_config_from_dict({"model": {"peft": "lora", "lora": {"r": rank}}}).model
    nets = {}
    for contender in ("full", "LoRA", "LoRA, peft's fold"):
        torch.manual_seed(0)
        net = DeepseekV3ForCausalLM(config)
        if contender != "full":
            net = lora.apply_lora(net, cfg, seed=0)
        if contender == "LoRA, peft's fold":
            _as_peft_forward(net)
        nets[contender] = net.train()
    ids = torch.randint(0, 384, (1, MICRO_TOKENS + 1), generator=torch.Generator().manual_seed(0))
    seconds: dict[str, list[float]] = {contender: [] for contender in nets}
    for step in range(steps):
        for contender in (list(nets) if step % 2 == 0 else list(nets)[::-1]):
            start = time.process_time()
            logits = nets[contender](input_ids=ids[:, :-1]).logits
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
            seconds[contender].append(time.process_time() - start)
            nets[contender].zero_grad(set_to_none=True)
    return {"experts": name, "steps": steps, "rank": rank, "load_average": os.getloadavg()[0],
            **{contender: {"median_ms": 1e3 * statistics.median(s[1:]), "step_s": s[1:]}
               for contender, s in seconds.items()}}


def report_experts(rows: list[dict[str, Any]]) -> None:
    print(f"{'experts':>15}   {'fwd+bwd ms: full':>16} {'LoRA':>6} {'peft fold':>10}   {'LoRA/full':>9} {'fold/full':>9}")
    for r in rows:
        full, ours, fold = (r[c]["median_ms"] for c in ("full", "LoRA", "LoRA, peft's fold"))
        print(f"{r['experts']:>15}   {full:>16.1f} {ours:>6.1f} {fold:>10.1f}   {ours / full:>9.2f} {fold / full:>9.2f}")


def _as_peft_forward(net: torch.nn.Module) -> None:
    """The same adapters run by peft's own ParamWrapper forward (its fold), for reference."""
    for module in net.modules():
        if isinstance(module, expert_lora.GroupedLoraParamWrapper):
            module.__class__ = ParamWrapper


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


def measure_checkpoints(shape: str, workdir: Path, steps: int) -> dict[str, Any]:
    folder = make_model_folder(workdir / f"{shape}-folder", **SHAPES[shape])
    model = folder_model_keys(folder)
    row: dict[str, Any] = {"shape": shape, "load_s": load_seconds(folder),
                           "parameters": sum(p.numel() for p in _meta_model(folder).parameters())}
    for peft in ("lora", "none"):
        trial = write_trial(workdir / f"{shape}-{peft}", model, peft, steps)
        if run_trial(trial) != EXIT_OK:
            raise SystemExit(f"FAIL: {trial}: {json.loads((trial / 'metrics.json').read_text()).get('error')}")
        times = checkpoint_times(trial)
        row[peft] = {"save_s": times["save_s"], "checkpoint_mb": times["checkpoint_gb"] * 1e3}
    return row


def _meta_model(folder: Path) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder, local_files_only=True))


def report_checkpoints(rows: list[dict[str, Any]]) -> None:
    print(f"{'shape':>6} {'params':>8} {'load':>7}   {'checkpoint MB LoRA / full':>26}   {'save s LoRA / full':>20}")
    for r in rows:
        lo, fu = r["lora"], r["none"]
        print(f"{r['shape']:>6} {r['parameters'] / 1e6:>7.1f}M {r['load_s']:>6.2f}s   "
              f"{lo['checkpoint_mb']:>8.2f} / {fu['checkpoint_mb']:<8.1f} x{lo['checkpoint_mb'] / fu['checkpoint_mb']:.3f}   "
              f"{lo['save_s']:>5.2f} / {fu['save_s']:<5.2f} x{lo['save_s'] / fu['save_s']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", nargs="+", choices=list(SHAPES), default=None,
                        help="model shapes (default: moe; with --checkpoints: tiny 125m)")
    parser.add_argument("--steps", type=int, default=8, help="steps of each contender (default: %(default)s)")
    parser.add_argument("--rank", type=int, default=8, help="model.lora.r (default: %(default)s)")
    parser.add_argument("--checkpoints", action="store_true",
                        help="measure load time, checkpoint size and save time of trials instead")
    parser.add_argument("--experts", action="store_true",
                        help="time the routed experts alone at 8, 64 and 256 experts (forward and backward)")
    parser.add_argument("--workdir", type=Path, help="where folders and trial dirs go (default: a temporary dir)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)  # CPU time of one thread: the contenders compare on the same footing
    shapes = args.shape or (["tiny", "125m"] if args.checkpoints else ["moe"])
    with tempfile.TemporaryDirectory(prefix="finetune-") as tmp:
        workdir = args.workdir or Path(tmp)
        if args.experts:
            rows = [measure_experts(name, max(args.steps, 2), args.rank) for name in EXPERT_SHAPES]
            report_experts(rows)
        elif args.checkpoints:
            rows = [measure_checkpoints(shape, workdir, args.steps) for shape in shapes]
            report_checkpoints(rows)
        else:
            rows = [measure_speed(shape, workdir, args.steps, args.rank) for shape in shapes]
            report_speed(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
