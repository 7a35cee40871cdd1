"""Text and tokens: /tokenize, /detokenize and /apply-template (the chat template's prompt)."""

from __future__ import annotations

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.enums import MediaType
from litestar.params import JSONBody
from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.server import offload, requests
from app.server.bodies import encoded, too_large
from app.server.engine_view import EngineView, require_ready
from app.server.responses import Detokenized, TemplatePrompt, TokenIds, TokenPiece, TokenPieces
from app.server.schemas import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest

PIECE_BYTES = 20  # the least one {"id":N,"piece":"..."} entry takes: a body of more pieces is refused unbuilt


class TokensController(Controller):
    tags = ("tokens",)
    guards = (require_ready,)

    @post("/tokenize", status_code=200, name="tokenize")
    async def tokenize(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[TokenizeRequest]
    ) -> Response[TokenIds | TokenPieces]:
        limit = engine.settings.server.max_response_bytes
        content = await offload.run(request, tokens_body, engine.tokenizer, data, limit)
        return Response(content, media_type=MediaType.JSON)

    @post("/detokenize", status_code=200, name="detokenize")
    async def detokenize(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[DetokenizeRequest]
    ) -> Response[Detokenized]:
        limit = engine.settings.server.max_response_bytes
        content = await offload.run(request, detokenized_body, engine.tokenizer, data.tokens, engine.vocab_size, limit)
        return Response(content, media_type=MediaType.JSON)

    @post("/apply-template", status_code=200, name="apply-template")
    async def apply_template(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[ApplyTemplateRequest]
    ) -> TemplatePrompt:
        """The prompt text the chat template makes of these messages (a final assistant message
        continued, as the chat route continues it)."""
        prompt = await offload.run(
            request,
            requests.chat_prompt,
            data.messages,
            engine.tokenizer,
            None,
            engine.settings,
            tokenize=False,
            prefill=requests.continues_final_message(data.messages),
        )
        return TemplatePrompt(prompt=prompt)


def detokenized_body(tokenizer: TokenizerWrapper, tokens: list[int], vocab: int, limit: int) -> bytes:
    """The encoded answer, within `limit` bytes (server.max_response_bytes); blocking."""
    requests.check_token_ids(tokens, vocab)
    return encoded(lambda: Detokenized(content=tokenizer.decode(tokens)), limit)


def tokens_body(tokenizer: TokenizerWrapper, data: TokenizeRequest, limit: int) -> bytes:
    """The encoded answer, within `limit` bytes (server.max_response_bytes). Blocking: a megabyte
    of text takes seconds with pieces, so the route runs it off the event loop."""
    ids = list(tokenizer.encode(data.content, add_special_tokens=data.add_special))
    if not data.with_pieces:
        return encoded(lambda: TokenIds(tokens=ids), limit)
    if len(ids) * PIECE_BYTES > limit:
        raise too_large(f"at least {len(ids) * PIECE_BYTES} bytes ({len(ids)} pieces)", limit)
    return encoded(lambda: TokenPieces(tokens=[TokenPiece(id=t, piece=tokenizer.decode([t])) for t in ids]), limit)
