"""Mixture-of-experts layer: routing, expert-sorted token alignment, the fused Triton path and
the torch reference (see layer.py)."""
