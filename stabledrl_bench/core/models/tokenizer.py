"""Character-level tokenizer for the tiny model, built locally with `tokenizers` (nothing is downloaded).

One token per printable ASCII character (plus newline and tab) covers every task alphabet, GSM8K prose
included, so no text is ever out of vocabulary except non-ASCII symbols (mapped to ``<|unk|>``). Special
tokens mirror LLaDA's roles: a mask token for diffusion, EOS (which LLaDA keeps emitting as padding after the
answer), PAD, and chat-role markers used by a LLaDA-like chat template.
"""

from __future__ import annotations

import string

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, UNK, EOS, MASK = "<|pad|>", "<|unk|>", "<|eos|>", "<|mask|>"
SYSTEM, USER, ASSISTANT, EOT = "<|system|>", "<|user|>", "<|assistant|>", "<|eot|>"
SPECIAL_TOKENS = (PAD, UNK, EOS, MASK, SYSTEM, USER, ASSISTANT, EOT)

# LLaDA's template renders each turn as a header, the content and an end-of-turn marker, and ends the prompt
# with the assistant header when a generation prompt is requested. This is the same shape, with short markers.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% if not (loop.last and continue_final_message) %}{{ '<|eot|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def alphabet() -> list[str]:
    """Printable ASCII without the vertical tab, form feed and carriage return."""
    return [c for c in string.printable if c not in "\x0b\x0c\r"]


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A `PreTrainedTokenizerFast` with the special tokens above and a chat template; round-trips save/load."""
    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *alphabet()))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        eos_token=EOS,
        mask_token=MASK,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT, EOT],
        padding_side="left",
        model_max_length=2048,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
