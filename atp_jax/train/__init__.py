"""Adversarial training (the seed paper's defense, A.9): fine-tune a victim to stay correct under worst-case table
orders that an inner attack finds on its current weights."""
