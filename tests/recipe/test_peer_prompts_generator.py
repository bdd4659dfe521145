"""tests/recipe/data/peer_prompts.json is exactly what tools/gen_peer_prompts.py records from
deepseek-recipe 0.2.0, so its prompts are the peer's and not hand-edited."""
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest

from .conftest import DATA

REPO = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("_kf_tool_gen_peer_prompts", REPO / "tools" / "gen_peer_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peer_prompts_are_the_generators_output():
    pytest.importorskip("deepseek_recipe", reason="deepseek-recipe (the peer that recorded the prompts) "
                                                  "is not installed: pip install deepseek-recipe==0.2.0")
    gen = _generator()
    installed = importlib.metadata.version("deepseek-recipe")
    if installed != gen.PEER_VERSION:
        pytest.skip(f"the prompts were recorded with deepseek-recipe {gen.PEER_VERSION}, {installed} is installed")
    assert gen.DEFAULT_OUTPUT.resolve() == (DATA / "peer_prompts.json").resolve()
    assert gen.render().encode("utf-8") == (DATA / "peer_prompts.json").read_bytes(), \
        "peer_prompts.json differs from tools/gen_peer_prompts.py's output: rerun the generator"


def test_generator_cases_are_the_shipped_requests():
    """Without the peer: the generator's request bodies are the ones the file records."""
    shipped = json.loads((DATA / "peer_prompts.json").read_text("utf-8"))
    assert [(c["name"], c["api"], c["body"]) for c in shipped] == [tuple(c) for c in _generator().CASES]
