"""Runs: results folders, their manifests and the records they hold (above attacks and eval)."""
