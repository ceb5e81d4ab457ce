"""Triton kernels of the GPU path, each beside a thin launcher that checks shapes and strides.

Import a kernel module only where Triton can run (CUDA, or CPU under ``TRITON_INTERPRET=1``):
this package's ``__init__`` deliberately imports nothing, so importing the runtime never needs
Triton.
"""
