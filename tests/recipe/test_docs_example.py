"""docs/recipe.md's non-streaming example runs as written (its own asserts check the result)."""
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "recipe.md"


def example_code() -> str:
    """The python block under the "Non-streaming example" heading."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Non-streaming example", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/recipe.md: no python block under 'Non-streaming example'"
    return match.group(1)


def test_non_streaming_example_runs():
    scope: dict = {}
    exec(compile(example_code(), f"{DOC}:non-streaming example", "exec"), scope)
    done = scope["completion_object"]
    assert done["object"] == "chat.completion" and done["usage"]["prompt_tokens"] == scope["n_prompt"]


def test_documented_model_names_are_the_accepted_ones():
    import kernforge.recipe as K
    from kernforge.recipe.options import DEFAULT_MODEL_VERSIONS

    section = DOC.read_text(encoding="utf-8").split("## Model names", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| `ModelVersion\.(\w+)` \|", section, re.M)
    assert {name: K.ModelVersion[version] for name, version in rows} == DEFAULT_MODEL_VERSIONS
