"""Tests for hpcsweep.trial.nccl: presets checked against golden files.

Regenerate the golden files after an intended change, then review the diff:

    python -m tests.unit.test_nccl --regenerate
    # or: HPCSWEEP_REGENERATE_GOLDEN=1 python -m pytest tests/unit/test_nccl.py
"""

import os
import sys
import typing
from pathlib import Path

import pytest
import yaml

from hpcsweep.config import NcclConfig
from hpcsweep.trial.nccl import (
    AUTO_PRESET,
    DEBUG_VARS,
    PRESETS,
    list_gpu_models,
    list_ib_devices,
    nccl_env,
    nccl_settings,
    parse_gpu_model,
    resolve_preset,
)

GOLDEN_DIR = Path(__file__).parent / "golden"
# A DGX-style node: eight compute HCAs and two storage ports (mlx5_8, mlx5_9), listed unsorted.
IB_DEVICES = ("mlx5_1", "mlx5_0", "mlx5_10", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8",
              "mlx5_9")
COMPUTE_HCAS = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]
H100 = ("NVIDIA H100 80GB HBM3",) * 8
A100 = ("NVIDIA A100-SXM4-80GB",) * 8

# golden file stem → nccl_settings arguments
GOLDEN_CASES = {
    "nccl_a100_ib": dict(preset="a100_ib", ib_devices=IB_DEVICES),
    "nccl_a100_ib_hca": dict(preset="a100_ib", ib_devices=IB_DEVICES, ib_hca=COMPUTE_HCAS),
    "nccl_h100_ib": dict(preset="h100_ib", ib_devices=IB_DEVICES),
    "nccl_a100_roce": dict(preset="a100_roce", ib_devices=IB_DEVICES),
    "nccl_a100_roce_hca": dict(preset="a100_roce", ib_devices=IB_DEVICES, ib_hca=["mlx5_0:1", "mlx5_1:1"]),
    "nccl_ethernet": dict(preset="ethernet"),
    "nccl_none": dict(preset="none"),
    "nccl_auto_ib": dict(preset="auto", ib_devices=IB_DEVICES, gpu_models=A100),
    "nccl_auto_h100": dict(preset="auto", ib_devices=IB_DEVICES, gpu_models=H100),
    "nccl_auto_no_ib": dict(preset="auto", gpu_models=H100),
    "nccl_a100_ib_debug": dict(
        preset="a100_ib", debug=True, topo_file="/etc/nccl/a100 topo.xml"
    ),
}


def env_block(preset: str, **options) -> str:
    """The preset's variables as ``NAME=value  # reason`` lines, under the preset it resolved to."""
    used = resolve_preset(preset, options.get("ib_devices", ()), options.get("gpu_models", ()))
    lines = [f"# NCCL preset {preset}" + ("" if used == preset else f" ({used} here)")]
    lines += [f"{s.name}={s.value}  # {s.reason}" for s in nccl_settings(preset, **options)]
    return "\n".join(lines) + "\n"


def regenerate() -> None:
    """Rewrite every golden file from the current presets."""
    GOLDEN_DIR.mkdir(exist_ok=True)
    for stem, kwargs in GOLDEN_CASES.items():
        (GOLDEN_DIR / f"{stem}.txt").write_text(env_block(**kwargs))


@pytest.mark.parametrize("stem", GOLDEN_CASES)
def test_golden(stem):
    text = env_block(**GOLDEN_CASES[stem])
    path = GOLDEN_DIR / f"{stem}.txt"
    if os.environ.get("HPCSWEEP_REGENERATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path} is stale; see this file's docstring to regenerate"


def test_every_preset_has_a_golden_file():
    assert {kw["preset"] for kw in GOLDEN_CASES.values()} == {*PRESETS, AUTO_PRESET}


def test_config_choices_and_config_files_are_the_presets():
    presets = typing.get_args(typing.get_type_hints(NcclConfig)["preset"])
    assert set(presets) == {*PRESETS, AUTO_PRESET}
    configs = Path(__file__).parents[2] / "configs"
    for preset in presets:
        values = yaml.safe_load((configs / "nccl" / f"{preset}.yaml").read_text()) or {}
        # Each file holds only what differs from NcclConfig's defaults: its preset's name, or nothing for auto.
        assert values == ({} if preset == NcclConfig().preset else {"preset": preset})
        assert NcclConfig(**values) == NcclConfig(preset=preset)
    assert "  - nccl: auto\n" in (configs / "config.yaml").read_text()
    assert NcclConfig().preset == AUTO_PRESET


@pytest.mark.parametrize(
    ("preset", "ib_devices", "gpu_models", "expected"),
    [
        ("auto", [], H100, "none"),
        ("auto", ["mlx5_0"], (), "a100_ib"),  # no driver to ask: the A100 preset, which is the H100 one too
        ("auto", ["mlx5_0"], A100, "a100_ib"),
        ("auto", ["mlx5_0"], H100, "h100_ib"),
        ("auto", ["mlx5_0"], ["NVIDIA H200"], "h100_ib"),
        ("auto", ["mlx5_0"], ["NVIDIA GH200 480GB"], "h100_ib"),
        ("auto", ["mlx5_0"], ["NVIDIA L40S"], "a100_ib"),
        ("ethernet", ["mlx5_0"], H100, "ethernet"),
        ("a100_roce", [], (), "a100_roce"),
    ],
)
def test_resolve_preset(preset, ib_devices, gpu_models, expected):
    assert resolve_preset(preset, ib_devices, gpu_models) == expected


def test_auto_exports_the_resolved_preset():
    assert nccl_env("auto", inherited={}) == {}
    assert nccl_env("auto", ib_devices=IB_DEVICES) == nccl_env("a100_ib", ib_devices=IB_DEVICES)
    assert nccl_env("auto", ib_devices=IB_DEVICES, gpu_models=H100) == nccl_env("h100_ib", ib_devices=IB_DEVICES)
    # nothing hpcsweep's own is exported: no variable carries a setting of hpcsweep's to its workers
    for preset in [*PRESETS, AUTO_PRESET]:
        assert not [name for name in nccl_env(preset, ib_devices=IB_DEVICES, debug=True) if name.startswith("HPCSWEEP_")]


def test_every_line_has_a_reason():
    for kwargs in GOLDEN_CASES.values():
        for line in env_block(**kwargs).splitlines()[1:]:
            assert len(line.split("  # ", 1)[1]) > 10


def test_debug_off_by_default():
    for preset in PRESETS:
        env = nccl_env(preset)
        assert not {v.name for v in DEBUG_VARS} & set(env)
    assert nccl_env("a100_ib", debug=True)["NCCL_DEBUG"] == "INFO"


def test_what_the_presets_leave_to_nccl():
    left_to_nccl = {"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_NVLS_ENABLE", "NCCL_IB_GID_INDEX"}
    for preset in [*PRESETS, AUTO_PRESET]:
        assert not left_to_nccl & set(nccl_env(preset, ib_devices=IB_DEVICES, gpu_models=H100)), preset
    assert nccl_env("ethernet")["NCCL_IB_DISABLE"] == "1"


def test_h100_and_a100_ib_presets_differ_only_in_their_name():
    # Nothing left in the IB presets depends on the GPU generation (NVLink SHARP is NCCL's call):
    # a variable that should differ has to be added to one of them on purpose, and this test changed.
    assert nccl_env("a100_ib") == nccl_env("h100_ib")


def test_ib_hca_is_opt_in_exact_and_checked_against_the_node():
    assert nccl_env("a100_ib", ib_devices=IB_DEVICES, ib_hca=["mlx5_1", "mlx5_0", "mlx5_1"])["NCCL_IB_HCA"] == (
        "=mlx5_1,mlx5_0"
    )
    assert nccl_env("none", ib_devices=IB_DEVICES, ib_hca=["mlx5_0:1"])["NCCL_IB_HCA"] == "=mlx5_0:1"
    # A name NCCL cannot find makes it fall back to TCP without an error: refuse it on the node.
    with pytest.raises(ValueError, match=r"nccl\.ib_hca: mlx5_12 not found in /sys/class/infiniband .*mlx5_0, mlx5_1"):
        nccl_env("a100_ib", ib_devices=IB_DEVICES, ib_hca=["mlx5_0", "mlx5_12"])
    with pytest.raises(ValueError, match=r"nccl\.ib_hca: mlx5_0 not found .*\(found: none\)"):
        nccl_env("auto", ib_hca=["mlx5_0"])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"ib_hca": ["mlx5 0"]}, r"nccl\.ib_hca\[0\]='mlx5 0' is not allowed: an HCA name"),
        ({"ib_hca": ["=mlx5_0"]}, r"nccl\.ib_hca\[0\]='=mlx5_0' is not allowed"),
        ({"preset": "ethernet", "ib_hca": ["mlx5_0"]}, r"nccl\.ib_hca=\['mlx5_0'\] is not allowed: empty with nccl\.preset=ethernet"),
    ],
)
def test_ib_hca_config_is_checked_before_submission(values, message):
    with pytest.raises(ValueError, match=message):
        NcclConfig(**values)
    assert NcclConfig(ib_hca=["mlx5_0", "mlx5_1:1"]).ib_hca == ["mlx5_0", "mlx5_1:1"]


def test_precedence_preset_inherited_debug_overrides():
    inherited = {"NCCL_IB_HCA": "=mlx5_4", "NCCL_DEBUG": "WARN", "NCCL_IB_TIMEOUT": "20", "PATH": "/bin"}
    env = nccl_env(
        "a100_ib",
        ib_devices=IB_DEVICES,
        ib_hca=COMPUTE_HCAS,
        debug=True,
        overrides={"NCCL_IB_TIMEOUT": "23", "NCCL_ALGO": "Ring"},
        inherited=inherited,
    )
    assert env["NCCL_IB_HCA"] == "=mlx5_4"  # the site's environment beats the preset's guess
    assert env["NCCL_DEBUG"] == "INFO"  # explicit debug=True beats a login-shell variable
    assert env["NCCL_IB_TIMEOUT"] == "23"  # explicit overrides beat everything
    assert env["NCCL_ALGO"] == "Ring"  # overrides may add variables
    assert "PATH" not in env  # unrelated inherited variables are not copied
    assert env["NCCL_CROSS_NIC"] == "0"
    roce = nccl_env("a100_roce", overrides={"NCCL_IB_GID_INDEX": "3"}, inherited={"NCCL_SOCKET_IFNAME": "=ib0"})
    assert (roce["NCCL_IB_GID_INDEX"], "NCCL_SOCKET_IFNAME" in roce) == ("3", False)  # the site's own stays its own


def test_topo_file():
    assert nccl_env("none", topo_file="/t.xml") == {"NCCL_TOPO_FILE": "/t.xml"}


def test_unknown_preset_names_key_and_allowed_values():
    with pytest.raises(ValueError, match=r"nccl\.preset.*a100_ib, h100_ib, a100_roce, ethernet, none, auto"):
        nccl_env("a100_infiniband")


def test_bad_override_name():
    with pytest.raises(ValueError, match="nccl.overrides"):
        nccl_env("none", overrides={"NCCL IB": "1"})


def test_list_ib_devices(tmp_path):
    for name in ("mlx5_10", "mlx5_2", "mlx5_0"):
        (tmp_path / name).mkdir()
    assert list_ib_devices(str(tmp_path)) == ["mlx5_0", "mlx5_2", "mlx5_10"]
    assert list_ib_devices(str(tmp_path / "missing")) == []


GPU_INFORMATION = """Model: \t\t NVIDIA H100 80GB HBM3
IRQ:   \t\t 380
GPU UUID: \t GPU-5f2d4a4e-0000-0000-0000-000000000000
Bus Location: \t 0000:18:00.0
"""


def test_gpu_models_come_from_the_driver_files(tmp_path):
    assert parse_gpu_model(GPU_INFORMATION) == "NVIDIA H100 80GB HBM3"
    assert parse_gpu_model("IRQ: 380\n") is None
    for address, model in [("0000:2a:00.0", "NVIDIA A100-SXM4-80GB"), ("0000:18:00.0", "NVIDIA H100 80GB HBM3")]:
        (tmp_path / address).mkdir()
        (tmp_path / address / "information").write_text(GPU_INFORMATION.replace("NVIDIA H100 80GB HBM3", model))
    (tmp_path / "0000:99:00.0").mkdir()  # no information file: skipped
    assert list_gpu_models(str(tmp_path)) == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]
    assert list_gpu_models(str(tmp_path / "missing")) == []


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate"]:
        regenerate()
        print(f"rewrote {len(GOLDEN_CASES)} golden files in {GOLDEN_DIR}")
    else:
        sys.exit("usage: python -m tests.unit.test_nccl --regenerate")
