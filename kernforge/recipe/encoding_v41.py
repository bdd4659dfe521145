"""DeepSeek V4.1 prompt encoding: `<｜System｜>` turns, numeric effort budget, images."""
from .dsml import V41_DSML, dump_json
from .errors import ConversionError
from .prompt_text import SCHEMA_FORMAT, V41_EFFORT_BUDGET, V41_EFFORT_LINE
from .rendering import PromptEncoding


class DeepseekV41Encoding(PromptEncoding):
    """V4.1: system turns keep their place behind `<｜System｜>`; the effort is a 1-100 budget."""

    dsml = V41_DSML
    system_token = True
    hoist_system = False
    filter_empty_user_parts = False
    blank_line_in_empty_invoke = True
    missing_reasoning_is_empty = True
    supports_images = True
    json_object_text = SCHEMA_FORMAT + dump_json({"type": "json_object"})
    _effort_lines = {effort: V41_EFFORT_LINE.format(n=n) for effort, n in V41_EFFORT_BUDGET.items()}

    def effort_text(self, effort):
        try:
            return self._effort_lines[effort or "high"]
        except KeyError:
            raise ConversionError(f"unknown reasoning effort {effort!r}", param="reasoning_effort") from None
