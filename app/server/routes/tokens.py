"""Text and tokens: /tokenize, /detokenize and /apply-template (the chat template's prompt)."""

from __future__ import annotations

import asyncio

from litestar import Controller, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.server import requests
from app.server.engine_view import EngineView, require_ready
from app.server.responses import Detokenized, TemplatePrompt, TokenIds, TokenPiece, TokenPieces
from app.server.schemas import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest


class TokensController(Controller):
    tags = ("tokens",)
    guards = (require_ready,)

    @post("/tokenize", status_code=200, name="tokenize")
    async def tokenize(
        self, engine: NamedDependency[EngineView], data: JSONBody[TokenizeRequest]
    ) -> TokenIds | TokenPieces:
        return await asyncio.to_thread(tokens_of, engine.tokenizer, data)

    @post("/detokenize", status_code=200, name="detokenize")
    async def detokenize(self, engine: NamedDependency[EngineView], data: JSONBody[DetokenizeRequest]) -> Detokenized:
        requests.check_token_ids(data.tokens, engine.vocab_size)
        return Detokenized(content=await asyncio.to_thread(engine.tokenizer.decode, data.tokens))

    @post("/apply-template", status_code=200, name="apply-template")
    async def apply_template(
        self, engine: NamedDependency[EngineView], data: JSONBody[ApplyTemplateRequest]
    ) -> TemplatePrompt:
        """The prompt text the chat template makes of these messages (a final assistant message
        continued, as the chat route continues it)."""
        prompt = await asyncio.to_thread(
            requests.chat_prompt,
            data.messages,
            engine.tokenizer,
            None,
            engine.settings,
            tokenize=False,
            prefill=requests.continues_final_message(data.messages),
        )
        return TemplatePrompt(prompt=prompt)


def tokens_of(tokenizer: TokenizerWrapper, data: TokenizeRequest) -> TokenIds | TokenPieces:
    """Blocking: a megabyte of text takes seconds with pieces, so the route runs it on a thread."""
    ids = list(tokenizer.encode(data.content, add_special_tokens=data.add_special))
    if not data.with_pieces:
        return TokenIds(tokens=ids)
    return TokenPieces(tokens=[TokenPiece(id=t, piece=tokenizer.decode([t])) for t in ids])
