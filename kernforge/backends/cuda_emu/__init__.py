"""Backend "cuda-emu": the CUDA renderer's unchanged output compiled and run on the host (emulator headers, glue)."""
