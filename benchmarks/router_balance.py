"""What router balance costs a training step, and what it does to a router biased toward one expert.

    python benchmarks/router_balance.py [--steps 30] [--repeats 5]

Cost: the built-in model (``deepseek_tiny``: 4 experts, top-2) at batch 16 x 64, AdamW steps with the
balance attached (DeepSeek-V3's bias update at 0.001, the aux loss at 0.001 and the window statistics)
and without it (no hooks at all), alternating in this one process on one thread, CPU time of steps
2..N (step 1 left out); the median of the back-to-back pairs' ratios is reported.

    python benchmarks/router_balance.py --lora-folder DIR --tokenizer TOKENIZER_DIR

writes, instead, the folder of issue 38's LoRA collapse (``lora_collapse_folder``) and a text corpus
beside it (``DIR-corpus/docs.txt``: this checkout's docs), and prints the trials to run on them
(benchmarks/README.md, "MoE router balance", has the figures).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from hpcsweep.config import ModelConfig, MoeConfig  # noqa: E402
from hpcsweep.train import model as models  # noqa: E402
from hpcsweep.train.moe import load_balance  # noqa: E402
from hpcsweep.train.distributed import WorldInfo  # noqa: E402

ONE = WorldInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend=None)


def step_seconds(balanced: bool, steps: int) -> float:
    """CPU seconds per step of steps 2..``steps``, with or without the balance attached."""
    cfg = ModelConfig(moe=MoeConfig(aux_loss_coef=0.001, bias_update_rate=0.001))
    net = models.build_model(cfg, seed=0)
    balance = load_balance.attach(net, cfg) if balanced else load_balance.NoBalance()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    net.train()
    start = 0.0
    for step in range(1, steps + 1):
        if step == 2:
            start = time.process_time()
        inputs = torch.randint(0, cfg.vocab_size, (16, 64), generator=generator)
        logits = net(input_ids=inputs).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), inputs[:, 1:].flatten())
        (loss + balance.take_aux_loss()).backward()
        balance.after_optimizer_step(ONE)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            balance.window_report(ONE)
    return (time.process_time() - start) / (steps - 1)


V3_SIZES = dict(
    hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    max_position_embeddings=512,
    # 3 MoE layers after 1 dense one (the published 3 dense of 61, scaled to 4 layers).
    first_k_dense_replace=1,
)
"""DeepseekV3Config's sizes, shrunk; every other key keeps the class default (which mirrors DeepSeek-V3)."""
V3_ROUTING = dict(n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1)
"""8 experts, top-2, in one group (the default 8 groups of 256 experts cannot hold 8 experts)."""
TRIAL = ("python -m hpcsweep model=pretrained model.path={folder} model.peft=lora model.lr=1e-3 "
         "data=text data.files={corpus} data.batch_size=8 data.seq_len=64 trainer.device=cpu "
         "trainer.max_steps=120 trainer.log_every=4 trainer.eval_every=60 trainer.ckpt_every=0 "
         "hydra.run.dir={runs}/{name}{extra}")


def lora_collapse_folder(folder: Path, tokenizer_dir: Path) -> Path:
    """An 8-expert top-2 DeepSeek-V3 folder at a seeded random init (seed 0), with the tokenizer of
    ``tokenizer_dir`` (issue 38 used Qwen 3's: ``tests/data/qwen3_tokenizer.tar.xz``, extracted)."""
    from transformers import AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = DeepseekV3Config(
        **V3_SIZES, **V3_ROUTING, vocab_size=len(tok),
        # The token ids the tokenizer has (the class defaults, 0 and 1, are DeepSeek-V3's own).
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    DeepseekV3ForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lora-folder", type=Path, help="write issue 38's 8-expert V3 folder here, and stop")
    parser.add_argument("--tokenizer", type=Path, help="with --lora-folder: a Hugging Face tokenizer folder")
    args = parser.parse_args()
    if args.lora_folder:
        folder = lora_collapse_folder(args.lora_folder, args.tokenizer)
        corpus = folder.with_name(folder.name + "-corpus")
        corpus.mkdir(exist_ok=True)
        docs = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]
        (corpus / "docs.txt").write_text("".join(path.read_text() for path in docs))
        runs = folder.with_name(folder.name + "-runs")
        for name, extra in (("default", ""), ("aux_off", " model.moe.aux_loss_coef=0")):
            print(TRIAL.format(folder=folder, corpus=corpus / "docs.txt", runs=runs, name=name, extra=extra))
        return
    torch.set_num_threads(1)
    ratios = []
    for _ in range(args.repeats):
        off, on = step_seconds(False, args.steps), step_seconds(True, args.steps)
        ratios.append(on / off)
        print(f"step CPU time: balance off {1000 * off:.1f} ms, on {1000 * on:.1f} ms")
    print(f"balance on / off step CPU time, median of {args.repeats} pairs: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
