"""The numpy reference interpreter of the tile IR (backend ``interp``): the semantic oracle."""
from kernforge.interp.executor import Interpreter

__all__ = ["Interpreter"]
