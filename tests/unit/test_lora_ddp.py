"""LoRA under DDP on two gloo ranks: the trial trains, and the checkpoint the two ranks wrote reads
back whole in one process without a process group (as the export reads it), with the final adapters."""

import torch

from hpcsweep.export.weights import load_trial_model, trial_config
from hpcsweep.train.trackers.metrics import weights_sha256
from hpcsweep.train.checkpoint.trained_state import trained_state_dict

from .test_trainer_ddp import BASE, torchrun
from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)


def test_two_ranks_train_the_adapters_and_their_checkpoint_reads_back_in_one_process(tmp_path):
    trial = make_trial_dir(tmp_path / "trial", {**BASE, "model.peft": "lora", "model.lora.r": 4,
                                                "trainer.max_steps": 4, "trainer.eval_every": 4})
    assert torchrun(trial) == 0, (trial / "torchrun.err").read_text()[-3000:]
    done = read_metrics(trial)
    assert (done["status"], done["world_size"]) == ("completed", 2)
    net = load_trial_model(trial_config(trial), max((trial / "checkpoints").glob("step*.pt")))
    assert weights_sha256(trained_state_dict(net)) == done["weights_sha256"]
