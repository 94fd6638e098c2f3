"""hpcsweep's Hydra configs, shipped inside the package as ``hpcsweep.configs``.

The YAML files hold presets only. The defaults of every key are the dataclass defaults of
``hpcsweep.config``, stored here as the ConfigStore node ``hpcsweep_defaults`` that
``config.yaml`` lists first, so every key exists for ``model.lr=...``, ``--help`` and
``--cfg job``. Hydra imports this package to read the YAML (``pkg://hpcsweep.configs``),
so the node is stored before any composition looks it up.
"""

from hydra.core.config_store import ConfigStore

from hpcsweep.config import config_defaults

DEFAULTS_NODE = "hpcsweep_defaults"

ConfigStore.instance().store(name=DEFAULTS_NODE, node=config_defaults(), provider="hpcsweep")
