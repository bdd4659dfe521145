"""What every API's stream event has in common: a dict payload and its compact JSON."""
import json


def compact_json(obj) -> str:
    """The JSON text put on the wire: UTF-8 kept as is, no spaces (as the official APIs send)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class StreamEvent:
    """One server-sent event of a Responses or Messages stream."""

    __slots__ = ("data",)

    def __init__(self, data: dict):
        self.data = data

    @property
    def type(self) -> str:
        return self.data["type"]

    def to_json(self) -> str:
        return compact_json(self.data)
