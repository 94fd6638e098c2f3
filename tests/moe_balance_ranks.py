"""Run by torchrun (two gloo ranks) from tests/unit/test_moe_balance_ddp.py: DeepSeek-V3's bias update
on each rank from its own tokens, summed over ranks. Writes ``OUT/rank<N>.json``: per step, this rank's
tokens per expert, and the bias before and after the update.

    python -m torch.distributed.run --nproc-per-node=2 tests/moe_balance_ranks.py OUT STEPS RATE
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpcsweep.config import ModelConfig, MoeConfig  # noqa: E402
from hpcsweep.train.moe import load_balance  # noqa: E402
from hpcsweep.train.distributed import WorldInfo  # noqa: E402
from tests.moe_models import skew_router, tiny_moe  # noqa: E402


def main(out: Path, steps: int, rate: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = WorldInfo(rank=rank, local_rank=rank, world_size=dist.get_world_size(), device=torch.device("cpu"),
                      backend="gloo")
    model = tiny_moe("v3")
    skew_router(model, "v3")
    balance = load_balance.attach(model, ModelConfig(moe=MoeConfig(aux_loss_coef=0.0, bias_update_rate=rate)))
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias
    generator = torch.Generator().manual_seed(rank)
    model.train()
    record = []
    for _ in range(steps):
        # The ranks read different halves of the vocabulary, so their loads differ.
        with torch.no_grad():
            model(input_ids=torch.randint(32 * rank, 32 * (rank + 1), (4, 16), generator=generator))
        balance.take_aux_loss()
        before = bias.tolist()
        counts = balance.step_counts[0].tolist()
        balance.after_optimizer_step(world)
        record.append({"counts": counts, "before": before, "after": bias.tolist()})
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
