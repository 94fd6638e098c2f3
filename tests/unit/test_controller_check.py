"""``hpcsweep.slurm.commands.controller_reachable``: a SLURM_CONF that names no file means no controller, said
without running scontrol (which retries for about a minute before it fails)."""

from __future__ import annotations

from hpcsweep.slurm import commands


def test_a_slurm_conf_that_names_no_file_is_no_controller_without_asking_scontrol(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(commands.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(commands, "run_slurm", lambda argv, **kw: asked.append(argv) or "Slurmctld(primary) at c1 is UP\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    assert commands.controller_reachable() == (False, f"no Slurm controller (SLURM_CONF={tmp_path / 'missing.conf'} is no file)")
    assert asked == []
    # A file that is there: scontrol is asked, as before.
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    assert commands.controller_reachable() == (True, "scontrol ping: Slurmctld(primary) at c1 is UP")
    assert asked == [["scontrol", "ping"]]
