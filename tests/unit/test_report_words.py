"""Words that say what a trial was (#31's smaller items): a local CPU sweep's hours are CPU-hours, not
GPU-hours; a trial trained from scratch is not "full fine-tuning"."""

from __future__ import annotations

from hpcsweep import report
from hpcsweep.config import trial_config_from_dict
from hpcsweep.files.usage_file import USAGE_FILE, LocalRun, write_runs
from hpcsweep.memory_plan import TrainingSetup, describe, setup_of_trial

from .sweep_fixtures import make_sweep, metrics

CPU_PEAK = {"memory_peak": {"bytes": 2**30, "source": "rss"}}
GPU_PEAK = {"memory_peak": {"bytes": 2**30, "source": "torch.cuda.max_memory_allocated"}}


def test_a_local_sweep_on_cpus_reports_cpu_hours(tmp_path, capsys):
    make_sweep(tmp_path, [(["model.lr=1e-4"], metrics("completed", **CPU_PEAK)),
                          (["model.lr=1e-3"], metrics("completed", **CPU_PEAK))])
    for num in (0, 1):
        write_runs(tmp_path / str(num) / USAGE_FILE, [LocalRun(0.0, 1800.0, 2, True)])
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert "CPU-h" in header and "GPU-h" not in header and header[header.index("CPU-h") + 1:][:2] == ["own", "CPU-h"]
    assert "CPU-hours: 2 allocated in all (every run of every task); the trials' own share 4" in out
    assert report.main([str(tmp_path), "--efficiency"]) == 0
    efficiency_header = capsys.readouterr().out.splitlines()[0].split()
    assert "CPU-h" in efficiency_header and "GPU-h" not in efficiency_header


def test_gpu_hours_stay_for_gpu_trials_and_on_slurm(tmp_path, capsys):
    make_sweep(tmp_path / "gpu", [(["model.lr=1e-4"], metrics("completed", **GPU_PEAK)),
                                  (["model.lr=1e-3"], metrics("completed", **CPU_PEAK))])
    assert report.main([str(tmp_path / "gpu")]) == 0
    assert "GPU-h" in capsys.readouterr().out.splitlines()[0].split()
    # Nothing measured yet (trials pending): the unit stays GPU.
    make_sweep(tmp_path / "pending", [(["model.lr=1e-4"], None)])
    assert report.main([str(tmp_path / "pending")]) == 0
    assert "GPU-h" in capsys.readouterr().out.splitlines()[0].split()


def test_a_trial_trained_from_scratch_is_not_called_fine_tuning(tmp_path):
    built_in = trial_config_from_dict({})
    setup = setup_of_trial(built_in, world_size=1, device="cuda")
    assert setup.from_scratch and describe(setup) == "training from scratch, DDP"
    lora = trial_config_from_dict({"model": {"peft": "lora"}})
    assert describe(setup_of_trial(lora, world_size=1, device="cuda")) == "LoRA r=16, DDP"
    assert describe(TrainingSetup(precision="bf16", batch_size=1, seq_len=8)) == "full fine-tuning, DDP"
    folder = trial_config_from_dict({"model": {"path": str(tmp_path / "model")}})
    assert describe(setup_of_trial(folder, world_size=1, device="cuda")) == "full fine-tuning, DDP"
    random = trial_config_from_dict({"model": {"path": str(tmp_path / "model"), "random_init": True}})
    assert describe(setup_of_trial(random, world_size=1, device="cuda")) == "training from scratch, DDP"
