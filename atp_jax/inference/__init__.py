"""Inference: greedy generation and the reference answer's loss, always over re-rendered prompts."""
