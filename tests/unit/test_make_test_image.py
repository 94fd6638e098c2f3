"""The pure parts of ``scripts/make-test-image``: which distributions the image gets, the key its root file
system is cached under, and the bundle's ``config.json``. The script is loaded by path (no ``.py``
suffix); ``tests/cluster/test_container_oci.py`` runs trials in the bundle it builds."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make-test-image"


def load_script():
    loader = importlib.machinery.SourceFileLoader("make_test_image_script", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    sys.modules[loader.name] = module
    loader.exec_module(module)
    return module


mti = load_script()

# What `runc spec` writes (runc 1.1), the parts the bundle changes.
SPEC = {
    "process": {"terminal": True, "args": ["sh"], "cwd": "/", "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024}]},
    "root": {"path": "rootfs", "readonly": True},
    "hostname": "runc",
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm"},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs"},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup"},
    ],
    "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
}


def test_the_bundle_shares_the_hosts_network_and_sees_tmp_and_the_binds_at_the_same_path():
    config = mti.bundle_config(SPEC, ["/srv/cluster", "/tmp", "/tmp/hpcsweep-cluster"])
    assert config["linux"]["namespaces"] == [{"type": "mount"}]
    assert config["process"]["terminal"] is False and "rlimits" not in config["process"]
    assert "hostname" not in config and config["root"] == {"path": "rootfs", "readonly": True}
    mounts = {m["destination"]: m for m in config["mounts"]}
    assert mounts["/sys"]["type"] == "bind" and "ro" in mounts["/sys"]["options"]
    assert "/sys/fs/cgroup" not in mounts
    assert mounts["/dev/shm"]["source"] == "/dev/shm" and mounts["/root"]["type"] == "tmpfs"
    assert mounts["/tmp"]["source"] == "/tmp" and mounts["/srv/cluster"]["source"] == "/srv/cluster"
    assert mounts["/etc/hosts"]["options"][-1] == "ro"
    assert [m["destination"] for m in config["mounts"]].count("/tmp") == 1
    assert "/tmp/hpcsweep-cluster" not in mounts  # under /tmp, seen through its mount
    assert SPEC["process"]["terminal"] is True  # the spec given is left as it was


def test_the_image_gets_the_installed_versions_of_the_whole_requirement_closure():
    pins = mti.pinned_closure(["hydra-core>=1.3,<1.4", "torch>=2.1"])
    import hydra
    import torch

    assert pins["hydra-core"] == hydra.__version__ and pins["torch"] == torch.__version__
    assert "omegaconf" in pins and "antlr4-python3-runtime" in pins  # hydra-core's own requirements
    with pytest.raises(mti.ImageError, match="no-such-dist-hpcsweep is not installed"):
        mti.pinned_closure(["no-such-dist-hpcsweep>=1"])


def test_install_requires_reads_setup_cfg_without_comments(tmp_path):
    cfg = tmp_path / "setup.cfg"
    cfg.write_text("[options]\ninstall_requires =\n    torch>=2.1\n    # why\n    numpy>=1.24  # and why\n")
    assert mti.install_requires(cfg) == ["torch>=2.1", "numpy>=1.24"]


def test_the_cache_key_changes_with_any_pin_and_the_python():
    key = mti.image_key({"torch": "2.13.0+cpu"}, "3.11")
    assert key == mti.image_key({"torch": "2.13.0+cpu"}, "3.11")
    assert key != mti.image_key({"torch": "2.13.1+cpu"}, "3.11")
    assert key != mti.image_key({"torch": "2.13.0+cpu"}, "3.12")
