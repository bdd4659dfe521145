"""The DSML tool-call markup shared by rendering and parsing.

V4 spells the block `<｜DSML｜tool_calls>`, V4.1 `<｜DSML｜ calls>`; both use the same
structure, so one `DsmlNames` table drives the encoder and the parser.
"""
import json
from dataclasses import dataclass

from .errors import ConversionError


@dataclass(frozen=True)
class DsmlNames:
    """Words that follow the DSML token in each tag."""

    block: str
    invoke: str
    parameter: str


V4_DSML = DsmlNames("tool_calls", "invoke", "parameter")
V41_DSML = DsmlNames(" calls", " invoke", " parameter")


def dump_json(value) -> str:
    """JSON the way the reference encoder writes it: `, ` and `: ` separators, raw UTF-8."""
    return json.dumps(value, ensure_ascii=False)


def arguments_to_parameters(name: str, arguments: str) -> list[tuple[str, str, bool]]:
    """Split a history call's JSON-object arguments into (name, text, is_string) triples.

    Raises ConversionError when the arguments are not a JSON object: rendering
    them as anything else would teach the model a call it never made.
    """
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError as exc:
        raise ConversionError(f"arguments of tool call {name!r} are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConversionError(f"arguments of tool call {name!r} must be a JSON object")
    out = []
    for key, val in value.items():
        if isinstance(val, str):
            out.append((key, val, True))
        else:
            out.append((key, dump_json(val), False))
    return out
