"""Defenses against order attacks (permutation smoothing)."""
