"""Eval sets (local data + lm-eval task configs) and the quality runner."""
