"""Llama-2-chat prompts, encoded as Meta's llama/generation.py chat_completion does."""

from __future__ import annotations

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
