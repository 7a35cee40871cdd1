"""A token's own bytes, as log-probability answers report them (`bytes`, and `token` from them).

A byte-level BPE token may hold part of a UTF-8 character, so decoding it alone loses bytes;
the tokenizer's streaming detokenizer already maps every token to its symbol, which gives them back.
"""

from __future__ import annotations

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer, TokenizerWrapper, _byte_decoder

SPM_SPACE = "\u2581".encode()


def token_bytes(tokenizer: TokenizerWrapper, token: int) -> bytes:
    """The bytes token `token` adds to the text (a leading space included)."""
    detokenizer = tokenizer._detokenizer  # built once per tokenizer, with every token's symbol
    if isinstance(detokenizer, BPEStreamingDetokenizer) and token < len(detokenizer.tokenmap):
        decoder = _byte_decoder()
        symbol = detokenizer.tokenmap[token]
        return b"".join(bytes([decoder[c]]) if c in decoder else c.encode() for c in symbol)
    if isinstance(detokenizer, SPMStreamingDetokenizer) and token < len(detokenizer.tokenmap):
        return detokenizer.tokenmap[token].replace(SPM_SPACE, b" ")
    return tokenizer.decode([token]).encode()


def token_text(raw: bytes) -> str:
    """The token's text: its bytes as UTF-8, less any part of a character (as llama-server trims it)."""
    return raw.decode("utf-8", errors="ignore")
