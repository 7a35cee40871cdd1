"""The token history that repetition, frequency and presence penalties look at."""

from __future__ import annotations

from collections.abc import Iterable


class TokenHistory:
    """Prompt plus decided tokens. A value that can be rewound, because speculation retracts.

    During a speculative round the drafts are appended tentatively (each verify position is
    penalised as if the drafts before it were decided) and the rejected tail is rewound.
    """

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self._tokens = list(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        self._tokens.extend(tokens)

    def rewind(self, length: int) -> None:
        """Forget everything after the first `length` tokens."""
        del self._tokens[length:]

    def window(self, last_n: int, end: int | None = None) -> list[int]:
        """The `last_n` tokens before position `end` (default: the end); -1 means all of them."""
        end = len(self._tokens) if end is None else end
        start = 0 if last_n < 0 else max(0, end - last_n)
        return self._tokens[start:end]
