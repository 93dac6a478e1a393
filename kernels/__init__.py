"""Triton/CUDA kernels where the engines' kernels lose work to tile alignment (installed as `spec_plugins.kernels`)."""
