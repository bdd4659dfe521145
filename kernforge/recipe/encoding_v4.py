"""DeepSeek V4 prompt encoding: system text opens the prompt with no token."""
from .dsml import V4_DSML
from .errors import ConversionError
from .prompt_text import V4_EFFORT, V4_JSON_OBJECT_FORMAT
from .rendering import PromptEncoding


class DeepseekV4Encoding(PromptEncoding):
    """V4: every system message is gathered into the opening block; no vision input.

    No effort given means `high`, as in deepseek-recipe; `low` adds no effort text.
    """

    dsml = V4_DSML
    system_token = False
    hoist_system = True
    filter_empty_user_parts = True
    blank_line_in_empty_invoke = False
    missing_reasoning_is_empty = False
    supports_images = False
    json_object_text = V4_JSON_OBJECT_FORMAT

    def effort_text(self, effort):
        try:
            return V4_EFFORT[effort or "high"]
        except KeyError:
            raise ConversionError(f"unknown reasoning effort {effort!r}", param="reasoning_effort") from None
