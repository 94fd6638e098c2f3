"""Test tiers, as markers (registered in setup.cfg), so no test file has to carry them:

- ``cluster``: every test under ``tests/cluster``, which runs against the local Slurm cluster;
- ``slow``: the unit tests listed below, each over about 5 s on an idle 2-core machine (measured
  with ``--durations``): real trials in fresh processes, torchrun, pip installs.

``scripts/test.sh --fast`` runs ``tests/unit -m "not slow"``. A listed name that no longer exists
fails ``tests/unit/test_tiers.py``.
"""

from pathlib import Path

import pytest

TESTS = Path(__file__).parent
CLUSTER_TESTS = TESTS / "cluster"
UNIT_TESTS = TESTS / "unit"

SLOW_MODULES = {
    "test_fsdp_lora.py",  # a local sweep of two 2-rank trials, and two exports
    "test_ddp_buckets.py",  # three 4-rank torchrun trials
    "test_foreign_app.py",  # a venv with the foreign app installed, then local sweeps of it
    "test_export.py",  # a LoRA and a full trial, exported, loaded in a fresh process
    "test_finetune_benchmark.py",  # benchmarks/finetune.py's three contenders, tiny, in this process
    "test_chat_training.py",  # a 2-rank chat trial under torchrun and two 1-rank ones
    "test_lora_ddp.py",  # a torchrun run of two ranks
    "test_moe_balance_ddp.py",  # a torchrun run of two ranks
    "test_sharded_checkpoint.py",  # torchrun runs of two ranks
    "test_step_timer.py",  # three CPU trials in one module fixture (normal, slow data, timing off)
    "test_trainer_ddp.py",  # torchrun runs of two ranks
    "test_trainer_parallel.py",  # torchrun runs of two ranks (FSDP, DDP's communication hooks)
}
"""Unit test modules whose every test is slow (most share a module fixture that trains)."""
SLOW_TESTS = {
    "test_moe_balance.py": {"test_balance_halves_the_max_mean_load_of_a_router_biased_toward_one_expert"},
    "test_memory_plan.py": {
        "test_the_plans_adapters_are_the_trainable_parameters_of_the_wrapped_deepseek_v3",  # peft wraps 61 x 256 experts
        "test_the_plan_of_a_cpu_trial_is_within_20_percent_of_its_measured_peak",  # two CPU trials in fresh interpreters
    },
    "test_task_scores.py": {  # two CPU trials of the fact model, lm-eval every 2 steps in one
        "test_a_stalling_task_score_stops_the_trial_offline_and_training_is_unchanged_by_the_tasks",
        "test_two_ranks_wait_for_rank_0s_scores_and_stop_early_together",  # torchrun of two ranks
    },
    "test_corpus_checks.py": {"test_transformers_agrees_that_the_refused_tokenizer_has_no_eos"},  # imports transformers
    "test_earlier_sweep.py": {"test_the_same_command_again_prints_the_line_that_resumes_the_stopped_sweep"},
    "test_quiet_success.py": {"test_node_0_hosts_the_store_and_waits_for_the_other_nodes_to_be_done"},  # torch's import
    "test_budget_local.py": {"test_local_sweep_stops_and_skips_once_the_budget_is_spent"},
    "test_code_snapshot.py": {"test_tasks_import_the_snapshot_even_from_an_editable_checkout"},
    "test_example_model.py": {"test_it_writes_the_readmes_model_folder_and_corpus_as_the_tests_make_them"},
    "test_export_travel.py": {"test_an_adapter_names_its_base_as_typed_and_loads_over_a_copy_of_it_elsewhere"},
    "test_dpo_training.py": {
        "test_a_local_dpo_sweep_of_both_routes_reports_its_reward_accuracy",  # two DPO trials, their own process
        "test_two_ranks_train_as_one_rank_with_twice_the_pairs",  # torchrun of two ranks
    },
    "test_chat_data.py": {"test_a_local_chat_sweep_prepares_its_samples_once_and_reports_the_fill_rate",
                          "test_deepseek_v3_tokens_are_its_chat_template_and_the_mask_is_the_assistant_turns"},
    "test_interrupt_resume.py": {
        "test_ctrl_c_stops_the_sweep_with_a_checkpoint_and_the_printed_command_resumes_it",
        "test_resuming_with_another_lr_is_refused_unless_forced",
        "test_a_sweep_killed_outright_takes_its_running_trial_down_with_a_checkpoint",
    },
    "test_local_parallel.py": {
        "test_two_trials_run_at_once_each_in_its_own_process_with_the_weights_of_one_at_a_time",
        "test_another_apps_job_returns_come_back_in_trial_order_from_two_at_once",
    },
    "test_lora.py": {
        "test_a_stopped_and_resumed_lora_trial_ends_with_the_same_adapters",
        "test_a_lora_checkpoint_holds_the_adapters_and_the_base_identity_not_the_base",
    },
    "test_local_sweep.py": {
        "test_local_sweep_runs_every_trial_and_writes_sweep_json",
        "test_single_run_with_bad_value_exits_with_the_key",
    },
    "test_model_folder.py": {"test_the_entry_modules_keep_the_hub_offline_before_transformers_loads"},
    "test_remote_code_moe.py": {  # peft wraps 27 x 64 experts' linears of the 16B on the meta device
        "test_the_plans_adapters_are_the_trainable_parameters_of_the_wrapped_remote_code_16b"},
    "test_packaging.py": {"test_plain_install_runs_cfg_job_from_another_folder"},
    "test_pretrained_model.py": {
        "test_a_full_fine_tuning_trial_starts_from_the_saved_weights_and_refuses_a_changed_folder"
    },
    "test_search_study.py": {"test_every_rank_of_a_ddp_trial_stops_where_rank_0_is_told_to_prune"},
    "test_search_sweeper.py": {"test_a_local_search_runs_its_trials_in_turn_prunes_and_resumes"},
    "test_trackers.py": {
        "test_a_local_sweep_with_no_network_writes_offline_wandb_runs_and_survives_a_dead_mlflow_server"
    },
    "test_text_data.py": {
        "test_a_local_sweep_of_two_trials_tokenizes_its_text_once_before_the_first_starts",
        "test_prepare_data_with_a_model_folder_writes_what_the_sweep_reads",
    },
    "test_trainer_learning.py": {"test_val_loss_falls_far_below_the_unigram_entropy"},
    "test_warm_start.py": {"test_a_search_warm_started_from_an_8_trial_grid_holds_its_trials_then_asks_tpe"},
    "test_worker_failure.py": {"test_failing_workers_fail_the_trial_with_their_traceback"},
}
"""Slow tests by unit test module, by function name (every parameter set of a parametrized test)."""


def is_slow(path: Path, function_name: str) -> bool:
    if path.parent != UNIT_TESTS:
        return False
    return path.name in SLOW_MODULES or function_name in SLOW_TESTS.get(path.name, ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(CLUSTER_TESTS):
            item.add_marker(pytest.mark.cluster)
        elif is_slow(item.path, getattr(item, "originalname", item.name)):
            item.add_marker(pytest.mark.slow)
