"""The request bodies, as pydantic models with OpenAI's field names and types. Fields that change what is generated
and that llamafast does not implement are refused by name (ApiError 400), never ignored; fields that only describe
the caller (user, metadata, store, ...) are accepted and ignored, as other OpenAI-compatible servers do.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from llamafast.config import PENALTY_MAX, PENALTY_MIN, SEED_MAX, SEED_MIN
from llamafast.generate import MAX_TOP_LOGPROBS
from llamafast.serve.responses import ApiError

# Stop strings a request may give: OpenAI takes 4; editor assistants send a few more for their templates.
MAX_STOPS = 16


class _Body(BaseModel):
    # Strict: "5" is not a number and true is not 1, as in OpenAI's API; unknown fields are ignored.
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant"]  # developer: OpenAI's newer name for system
    content: str | list[TextPart] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            for part in value:
                if isinstance(part, dict) and part.get("type") not in (None, "text"):
                    raise ValueError(f"content parts of type {part.get('type')!r} are not supported: llamafast's "
                                     "models read text only")
        return value

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(_Body):
    include_usage: bool = False


class _Generation(_Body):
    """What chat and text completions share: the model, sampling and stopping."""

    model: str | None = None  # OpenAI requires it; other servers default it to the model they serve, as here
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # llama-server's extension
    repetition_penalty: float | None = Field(None, ge=PENALTY_MIN, le=PENALTY_MAX,
                                             validation_alias=AliasChoices("repetition_penalty", "repeat_penalty"))
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    return_token_ids: bool = False  # vLLM's extension: the prompt's and the completion's token ids in the choice

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        return value

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def refuse_unsupported(self) -> None:
        """The fields whose meaning llamafast does not implement, refused when they ask for it."""
        if self.n != 1:
            raise ApiError(f"n must be 1 (got {self.n}): llamafast decodes one sequence at a time", param="n")
        if self.logit_bias:
            raise ApiError("logit_bias is not supported", param="logit_bias")
        if self.stream_options is not None and not self.stream:
            raise ApiError("stream_options is only allowed when stream is true", param="stream_options")


class ChatRequest(_Generation):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens; it wins
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        for name in ("tools", "functions"):
            if getattr(self, name):
                raise ApiError(f"{name} are not supported: llamafast serves plain text chat", param=name)
        for name in ("tool_choice", "function_call"):
            if getattr(self, name) not in (None, "none", "auto"):
                raise ApiError(f"{name} is not supported: llamafast serves plain text chat", param=name)
        kind = (self.response_format or {}).get("type", "text")
        if kind != "text":
            raise ApiError(f"response_format {kind!r} is not supported; only text is", param="response_format")
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError("top_logprobs needs logprobs set to true", param="top_logprobs")

    def new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def alternatives(self) -> int | None:
        """Alternatives to report per token; None: no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def dialog(self) -> list[dict[str, str]]:
        """The messages as the chat template takes them: system for developer, text parts joined."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.suffix:
            raise ApiError("suffix is not supported: llamafast completes a prompt forwards only", param="suffix")
        if self.best_of not in (None, 1):
            raise ApiError(f"best_of must be 1 (got {self.best_of}): llamafast decodes one sequence at a time",
                           param="best_of")
        if self.echo and self.logprobs is not None:
            raise ApiError("echo with logprobs is not supported: llamafast does not score prompt tokens",
                           param="echo")

    def single_prompt(self) -> str | list[int]:
        """The one prompt: text, or token ids; a batch of several prompts is refused."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise ApiError(f"one prompt per request (got {len(p)}): llamafast decodes one sequence at a time",
                               param="prompt")
            p = p[0]
        if isinstance(p, list) and not p:
            raise ApiError("prompt holds no tokens", param="prompt")
        return p

    def new_tokens(self) -> int | None:
        return self.max_tokens


class TokenizeRequest(_Body):
    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]
