"""What the Hydra launchers do: validate every trial, then run or submit them."""
