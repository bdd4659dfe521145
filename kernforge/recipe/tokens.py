"""Special tokens of the DeepSeek V4 family and their spellings.

Rendering marks every template-inserted spelling as a special range, so a
tokenizer can encode it as one token while user text that happens to contain the
same characters stays plain text.
"""
import enum
from dataclasses import dataclass, fields, replace

from .errors import InvalidArgumentError


class SpecialToken(enum.Enum):
    Bos = "bos"
    Eos = "eos"
    ThinkingStart = "thinking_start"
    ThinkingEnd = "thinking_end"
    System = "system"
    User = "user"
    Assistant = "assistant"
    LatestReminder = "latest_reminder"
    Dsml = "dsml"
    Image = "image"
    Ref = "ref"
    RefEnd = "ref_end"
    Box = "box"
    BoxEnd = "box_end"
    Point = "point"
    PointEnd = "point_end"
    Polygon = "polygon"
    PolygonEnd = "polygon_end"

    def default_str(self) -> str:
        return getattr(_DEFAULTS, self.value)


@dataclass(frozen=True)
class SpecialTokens:
    """Spelling of each special token; keywords override single spellings."""

    bos: str = "<｜begin▁of▁sentence｜>"
    eos: str = "<｜end▁of▁sentence｜>"
    thinking_start: str = "<think>"
    thinking_end: str = "</think>"
    system: str = "<｜System｜>"
    user: str = "<｜User｜>"
    assistant: str = "<｜Assistant｜>"
    latest_reminder: str = "<｜latest_reminder｜>"
    dsml: str = "｜DSML｜"
    image: str = "<｜image｜>"
    ref: str = "<｜ref｜>"
    ref_end: str = "<｜/ref｜>"
    box: str = "<｜box｜>"
    box_end: str = "<｜/box｜>"
    point: str = "<｜point｜>"
    point_end: str = "<｜/point｜>"
    polygon: str = "<｜polygon｜>"
    polygon_end: str = "<｜/polygon｜>"

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(f"special token {f.name!r} must be a non-empty string")

    def token(self, token: SpecialToken) -> str:
        return getattr(self, token.value)

    def with_(self, **spellings: str) -> "SpecialTokens":
        return replace(self, **spellings)


_DEFAULTS = SpecialTokens()
DEFAULT_SPECIAL_TOKENS = _DEFAULTS
