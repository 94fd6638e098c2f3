"""The app's Hydra configs (a package, so that Hydra finds them as pkg://foreign_app.conf)."""
