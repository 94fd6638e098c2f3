"""A minimal Hydra app with its own config groups, as any user of hpcsweep's launchers might write."""
