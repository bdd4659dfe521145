"""Backend "interp": the numpy reference interpreter behind the backend contract."""
