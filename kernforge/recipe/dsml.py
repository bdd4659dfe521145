"""The DSML tool-call markup shared by rendering and parsing.

V4 spells the block `<｜DSML｜tool_calls>`, V4.1 `<｜DSML｜ calls>`; both use the same
structure, so one `DsmlNames` table drives the encoder and the parser.
"""
import json
from dataclasses import dataclass
from functools import lru_cache

from .errors import ConversionError


@dataclass(frozen=True)
class DsmlNames:
    """Words that follow the DSML token in each tag."""

    block: str
    invoke: str
    parameter: str


V4_DSML = DsmlNames("tool_calls", "invoke", "parameter")
V41_DSML = DsmlNames(" calls", " invoke", " parameter")


_ENCODER = json.JSONEncoder(ensure_ascii=False)
_decode = json.JSONDecoder().decode
# One C encoder for the life of the process: `JSONEncoder.encode` builds a new one
# per call, which costs more than encoding a small schema. Same output either way.
_C_ENCODE = (json.encoder.c_make_encoder(None, _ENCODER.default, json.encoder.encode_basestring, None,
                                         ": ", ", ", False, False, True)
             if json.encoder.c_make_encoder is not None else None)


def dump_json(value) -> str:
    """JSON the way the reference encoder writes it: `, ` and `: ` separators, raw UTF-8."""
    if _C_ENCODE is None or isinstance(value, str):
        return _ENCODER.encode(value)
    return "".join(_C_ENCODE(value, 0))


def _dump_value(value) -> str:
    """`dump_json` with shortcuts for the scalars that dominate tool arguments."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if type(value) is int:
        return str(value)
    return dump_json(value)


@lru_cache(maxsize=4096)
def arguments_to_parameters(name: str, arguments: str) -> tuple[tuple[str, str, bool], ...]:
    """Split a history call's JSON-object arguments into (name, text, is_string) triples.

    Raises ConversionError when the arguments are not a JSON object: rendering
    them as anything else would teach the model a call it never made. Cached:
    an agent resends its whole history every turn, so the same calls recur.
    """
    try:
        value = _decode(arguments) if arguments.strip() else {}
    except ValueError as exc:
        raise ConversionError(f"arguments of tool call {name!r} are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConversionError(f"arguments of tool call {name!r} must be a JSON object")
    return tuple([(key, val, True) if type(val) is str else (key, _dump_value(val), False)
                  for key, val in value.items()])
