"""Chat prompts: Llama-2-chat, encoded as Meta's llama/generation.py chat_completion does, built in; other
models' own Jinja templates (GGUF `tokenizer.chat_template`, tokenizer_config.json) rendered as transformers does."""

from __future__ import annotations

import json
from typing import Protocol

# Meta's llama/generation.py chat format.
B_INST, E_INST = "[INST]", "[/INST]"
B_SYS, E_SYS = "<<SYS>>\n", "\n<</SYS>>\n\n"


class _Encoder(Protocol):
    eos_id: int

    def encode(self, text: str, bos: bool = True) -> list[int]: ...


def llama2_chat_ids(tok: _Encoder, messages: list[dict[str, str]]) -> list[int]:
    """A Llama-2-chat conversation as Meta's llama/generation.py chat_completion encodes it: an optional
    system message folded into the first user message unstripped, then each user/assistant pair as
    `<s>[INST] {user} [/INST] {answer} </s>`, then the last user message; each text stripped only at the
    ends of what goes between the tags."""
    if messages and messages[0]["role"] == "system":
        first = B_SYS + messages[0]["content"] + E_SYS + messages[1]["content"]
        messages = [{"role": messages[1]["role"], "content": first}] + messages[2:]
    ids = []
    for prompt, answer in zip(messages[:-1:2], messages[1::2]):
        text = f"{B_INST} {prompt['content'].strip()} {E_INST} {answer['content'].strip()} "
        ids += tok.encode(text) + [tok.eos_id]
    return ids + tok.encode(f"{B_INST} {messages[-1]['content'].strip()} {E_INST}")


def render_chat_template(template: str, messages: list[dict[str, str]], bos_token: str, eos_token: str) -> str:
    """A model's own Jinja chat template rendered as Hugging Face's apply_chat_template does: a sandboxed
    environment with trim_blocks and lstrip_blocks, `raise_exception` and `tojson`, and the generation prompt."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from llamafast.errors import LlamafastError

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    # The sandbox refuses unsafe attributes and caps range() at 100,000 items (OverflowError), so a template
    # asking for range(100000000) fails at once instead of running for minutes.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, indent=indent, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                                                add_generation_prompt=True)
    except jinja2.exceptions.TemplateError as e:
        raise LlamafastError(f"the model's chat template failed to render: {e}") from None
    except Exception as e:  # the template is code from the model's files: {{ 1 // 0 }}, {{ "a" + 5 }}, range caps
        raise LlamafastError(f"the model's chat template failed to render: {type(e).__name__}: {e}") from None
