"""Backend "cuda": CUDA C++ for sm_80 / sm_90a / sm_100a (renderer, CUDA-only passes, device library, driver glue)."""
