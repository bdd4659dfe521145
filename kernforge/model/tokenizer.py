"""A byte-level tokenizer with the DeepSeek special tokens, for the smoke path.

It needs no download: ids 0 and 1 are BOS/EOS as in the real vocabulary, the
other chat special tokens follow, and the 256 byte values start at
`BYTE_OFFSET`. The prompt renderer marks where its special tokens are
(`special_ranges`), so a special-token spelling typed by the user stays
plain bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SPECIAL_TOKENS = (
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<think>", "</think>",
    "<｜System｜>", "<｜User｜>", "<｜Assistant｜>", "<｜latest_reminder｜>", "｜DSML｜", "<｜image｜>",
    "<｜ref｜>", "<｜/ref｜>", "<｜box｜>", "<｜/box｜>", "<｜point｜>", "<｜/point｜>",
    "<｜polygon｜>", "<｜/polygon｜>",
)
BYTE_OFFSET = 32
VOCAB_SIZE = BYTE_OFFSET + 256


class ByteTokenizer:
    bos_id = 0
    eos_id = 1

    def __init__(self) -> None:
        self.special_ids = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def encode(self, text: str, special_ranges: Iterable[tuple[int, int]] = ()) -> list[int]:
        """Bytes of `text`, except the `special_ranges` (str offsets), each one special token."""
        ids: list[int] = []
        pos = 0
        for start, end in special_ranges:
            if start < pos or end <= start or end > len(text):
                raise ValueError(f"special range {(start, end)} is out of order or out of bounds")
            spelling = text[start:end]
            if spelling not in self.special_ids:
                raise ValueError(f"{spelling!r} is not a known special token")
            ids.extend(self._bytes(text[pos:start]))
            ids.append(self.special_ids[spelling])
            pos = end
        ids.extend(self._bytes(text[pos:]))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            if not 0 <= i < VOCAB_SIZE:
                raise ValueError(f"token id {i} outside the tokenizer vocabulary [0, {VOCAB_SIZE})")
            if i >= BYTE_OFFSET:
                buf.append(i - BYTE_OFFSET)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            out.append(SPECIAL_TOKENS[i] if i < len(SPECIAL_TOKENS) else f"<unused_{i}>")
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    @staticmethod
    def _bytes(text: str) -> list[int]:
        return [BYTE_OFFSET + b for b in text.encode("utf-8")]
