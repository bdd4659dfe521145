"""kernforge: tile kernels written once in Python, generated for CPU C++, CUDA and Ascend C."""
__version__ = "0.1.0"
