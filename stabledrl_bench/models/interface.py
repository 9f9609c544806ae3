"""`DiffusionLM`: the one interface every sampler, estimator, trainer and evaluator talks to.

A backend wraps a Hugging Face model and its tokenizer and answers four questions the algorithms need:
logits for a (partially masked) batch under an attention mask; which ids are MASK / EOS / PAD; how to turn
prompts into left-padded token batches (chat template, prefill); and which attention pattern the model was
trained with (``full`` bidirectional like LLaDA, or ``block`` causal-across-blocks like SDAR).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from .tiny import KVCache

Message = dict[str, str]
Prompt = str | Sequence[Message]


class DiffusionLM:
    """A masked-diffusion language model behind a backend-independent interface.

    Subclasses (one per model family, see :mod:`stabledrl_bench.models.backends`) override
    :meth:`_forward` to adapt the call convention of their Hugging Face model.
    """

    family: str = "generic"
    shift_logits: bool = False  # Dream predicts token i at position i-1 (AR initialisation)
    supports_kv_cache: bool = False

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        mask_id: int,
        eos_id: int,
        pad_id: int,
        stop_ids: Sequence[int] = (),
        attention: str = "full",
        block_size: int | None = None,
        name: str = "",
    ) -> None:
        if attention not in ("full", "block"):
            raise ValueError(f"attention must be 'full' or 'block', got {attention!r}")
        if attention == "block" and not block_size:
            raise ValueError("block attention needs a block_size")
        self.model = model
        self.tokenizer = tokenizer
        self.mask_id = int(mask_id)
        self.eos_id = int(eos_id)
        self.pad_id = int(pad_id)
        self.stop_ids = tuple(dict.fromkeys((int(eos_id), *map(int, stop_ids))))
        self.attention = attention
        self.block_size = block_size
        self.name = name

    def with_model(self, model: nn.Module) -> DiffusionLM:
        """The same backend around another module (a DDP/FSDP wrapper, a frozen reference copy)."""
        clone = copy.copy(self)
        clone.model = model
        return clone

    # ------------------------------------------------------------------ forward passes
    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        kv_cache: KVCache | None,
        use_cache: bool,
    ) -> tuple[torch.Tensor, KVCache | None]:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            kv_cache=kv_cache,
            use_cache=use_cache,
        )
        return out.logits, out.kv_cache

    def logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, T, V] where row t predicts the clean token at position t.

        ``attention_mask`` is [B, T] key padding (True/1 = real token) or a boolean [B, 1, T, T] pattern.
        """
        logits, _ = self._forward(input_ids, attention_mask, position_ids, None, False)
        return self._shift(logits)

    def forward_cached(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        kv_cache: KVCache | None,
        use_cache: bool,
    ) -> tuple[torch.Tensor, KVCache | None]:
        """Like :meth:`logits` but against cached keys/values of earlier positions (exact for block attention)."""
        if not self.supports_kv_cache:
            raise NotImplementedError(f"the {self.family} backend has no KV cache")
        logits, cache = self._forward(input_ids, attention_mask, position_ids, kv_cache, use_cache)
        return self._shift(logits), cache

    def _shift(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.shift_logits:
            return logits
        return torch.cat((logits[:, :1], logits[:, :-1]), dim=1)

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def config_summary(self) -> dict[str, object]:
        """What a results file needs to identify the model."""
        n_params = sum(p.numel() for p in self.model.parameters())
        return {
            "family": self.family,
            "name": self.name,
            "attention": self.attention,
            "block_size": self.block_size,
            "mask_id": self.mask_id,
            "eos_id": self.eos_id,
            "parameters": n_params,
        }

    # ------------------------------------------------------------------ text <-> tokens
    def render_prompt(self, prompt: Prompt, *, chat_template: bool = True, prefill: str = "") -> str:
        """Prompt text as the model sees it: chat-templated messages (or raw text) followed by ``prefill``."""
        if isinstance(prompt, str):
            messages: list[Message] = [{"role": "user", "content": prompt}]
        else:
            messages = list(prompt)
        if chat_template:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = "\n\n".join(m["content"] for m in messages)
        return text + prefill

    def encode_prompts(
        self,
        prompts: Sequence[Prompt],
        *,
        chat_template: bool = True,
        prefill: str = "",
        max_prompt_length: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ``(input_ids, attention_mask)`` [B, P] on the model's device.

        Prompts longer than ``max_prompt_length`` keep their *last* tokens (the question and the prefill),
        the convention of d1/TRL's ``max_prompt_length``.
        """
        texts = [self.render_prompt(p, chat_template=chat_template, prefill=prefill) for p in prompts]
        encoded = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        if max_prompt_length is not None:
            encoded = [ids[-max_prompt_length:] for ids in encoded]
        width = max(len(ids) for ids in encoded)
        ids = torch.full((len(encoded), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.bool)
        for i, row in enumerate(encoded):
            if row:
                ids[i, width - len(row) :] = torch.tensor(row)
                mask[i, width - len(row) :] = True
        return ids.to(self.device), mask.to(self.device)

    def completion_mask(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """True up to and including the first stop token of each row (all True if there is none)."""
        is_stop = torch.isin(completion_ids, torch.tensor(self.stop_ids, device=completion_ids.device))
        seen_before = torch.cumsum(is_stop.long(), dim=1) - is_stop.long()
        return seen_before == 0

    def decode(self, completion_ids: torch.Tensor) -> list[str]:
        """Completion text cut at the first stop token, special tokens removed."""
        keep = self.completion_mask(completion_ids)
        texts = []
        for row, valid in zip(completion_ids.tolist(), keep.tolist(), strict=True):
            tokens = [t for t, v in zip(row, valid, strict=True) if v and t not in self.stop_ids]
            texts.append(self.tokenizer.decode(tokens, skip_special_tokens=True))
        return texts
