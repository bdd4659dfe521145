"""Backend "cpu": C++ with OpenMP for the host (renderer, templates, ctypes launch glue)."""
