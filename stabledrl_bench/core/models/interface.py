"""`DiffusionLM`: the one interface every sampler, estimator, trainer and evaluator talks to.

A backend wraps a Hugging Face model and its tokenizer and answers four questions the algorithms need:
logits for a (partially masked) batch under an attention mask; which ids are MASK / EOS / PAD; how to turn
prompts into left-padded token batches (chat template, prefill); and which attention pattern the model was
trained with (``full`` bidirectional like LLaDA, or ``block`` causal-across-blocks like SDAR).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from stabledrl_bench.core.masks import block_causal_mask, real_positions
from stabledrl_bench.errors import UserError

if TYPE_CHECKING:  # an annotation only: importing transformers costs seconds that e.g. `stress --help` need not pay
    from transformers import PreTrainedTokenizerBase

Message = dict[str, str]
Prompt = str | Sequence[Message]


class DiffusionLM:
    """A masked-diffusion language model behind a backend-independent interface.

    Subclasses (one per model family, see :mod:`stabledrl_bench.core.models.backends`) override :meth:`_forward` to
    speak their Hugging Face model's calling convention (how it takes masks, positions and a KV cache).

    Attention masks given to :meth:`logits` are either ``[B, T]`` key padding (True = real token; prompts are
    left-padded) or a boolean ``[B, 1, Q, K]`` pattern (block diffusion). Padding never changes a row's result:
    positions skip it (:func:`~stabledrl_bench.core.masks.real_positions`), and a model that ignores attention masks
    (``pad_free=True``, e.g. LLaDA's Hub file) never sees a pad token at all -- each group of rows with the same
    amount of padding runs on its own, unpadded.
    """

    family: str = "generic"
    shift_logits: bool = False  # Dream predicts token i at position i-1 (AR initialisation)
    supports_kv_cache: bool = False  # an exact cache for block attention (block_diffusion_generate)
    # Approximate caches for full attention (llada_generate's ``cache``): "prefix" needs keys cached for a prefix
    # of the sequence; "dual" also needs the positions after the queries cached, so explicit query positions.
    full_cache_modes: tuple[str, ...] = ()
    # Class names of the model's repeated decoder blocks: the unit of activation checkpointing and of FSDP sharding.
    block_classes: tuple[str, ...] = ()
    # The wrapped model's forward takes ``logits_to_keep`` (Hugging Face's name; here a slice of positions) and runs
    # its output head on those positions only (see :meth:`logits`' ``keep``).
    keeps_logits: bool = False

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
        pad_free: bool = False,
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
        self.pad_free = pad_free
        # The dtype forward passes compute in when it is not the weights' own: a model prepared for bf16 mixed
        # precision (accelerate's autocast around its forward, or FSDP2 gathering float32 masters as bf16) says
        # bf16 here, so that the convention probes judge it by bf16's rounding.
        self.compute_dtype: torch.dtype | None = None

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
        cache: Any,
        store: bool,
        keep: slice | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """One call of the wrapped model in its own convention: logits [B, Q, V] and the (updated) cache.

        ``attention_mask`` is None, [B, K] key padding or a boolean [B, 1, Q, K] pattern over the cached keys
        followed by these ones; ``cache`` is whatever an earlier call returned (None at first); ``store`` asks to
        keep this call's keys/values in it. ``keep`` (only where :attr:`keeps_logits`) asks for the logits of
        those positions only, [B, len, V].
        """
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            kv_cache=cache,
            use_cache=store,
            **({} if keep is None else {"logits_to_keep": keep}),
        )
        return out.logits, out.kv_cache

    def logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        keep: slice | None = None,
    ) -> torch.Tensor:
        """Logits [B, T, V] where row t predicts the clean token at position t.

        ``attention_mask`` is [B, T] key padding (True/1 = real token) or a boolean [B, 1, T, T] pattern.
        ``position_ids`` default to real-token positions for key padding, to ``0..T-1`` otherwise.

        ``keep`` (a slice of positions) returns only those positions' logits, ``logits(...)[:, keep]``. Without
        gradients, a model that :attr:`keeps_logits` runs its output head on them alone: a decoding step reads
        one block, and at LLaDA's vocabulary of 126,464 the head costs more than the blocks of a small model (and
        its logits are the largest tensor of the pass). Each kept row is the same dot products as before, and on
        the CPUs this project pins they come out bitwise the same (``regress``); a BLAS may pick another kernel
        for another matrix shape, as for another batch size. With gradients the whole head runs as before: the
        head's weight gradient sums over positions, and a sum over fewer rows is added up in another order.
        """
        raw = self._kept_head(keep, input_ids.shape[1])
        if keep is not None and raw is None:
            return self.logits(input_ids, attention_mask, position_ids)[:, keep]
        if attention_mask is not None and attention_mask.dim() == 2:
            key_valid = attention_mask.bool()
            if bool(key_valid.all()):
                attention_mask = None
            elif self.pad_free:
                return self._shift(self._pad_free_logits(input_ids, key_valid))
            elif position_ids is None:
                position_ids = real_positions(key_valid)
        elif attention_mask is not None and self.pad_free:
            raise UserError(
                f"model {self.name!r} ignores attention masks, so it cannot run a {attention_mask.dim()}-D attention "
                "pattern (block diffusion needs a model that honours its mask)"
            )
        if raw is not None:
            logits, _ = self._forward(input_ids, attention_mask, position_ids, None, False, keep=raw)
            return logits
        logits, _ = self._forward(input_ids, attention_mask, position_ids, None, False)
        return self._shift(logits)

    def _kept_head(self, keep: slice | None, length: int) -> slice | None:
        """The positions of the model's own output that make ``keep`` when the head can run on them alone, else
        None (the whole output is computed and sliced): no ``keep``, gradients on, a model without
        ``logits_to_keep``, a pad-free one, or a shifted model's first position (which repeats its position 0)."""
        if keep is None:
            return None
        start, stop, stride = keep.indices(length)
        if stride != 1:
            raise ValueError(f"keep must be a contiguous slice, got {keep}")
        shift = int(self.shift_logits)
        if torch.is_grad_enabled() or not self.keeps_logits or self.pad_free or start < shift or stop <= start:
            return None
        return slice(start - shift, stop - shift)

    def _pad_free_logits(self, input_ids: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
        """Logits of a left-padded batch computed without pad tokens: one call per amount of padding.

        Rows with p pads run as ``input_ids[rows, p:]`` with no mask; their logits go back to columns p.. (pad
        columns are 0: nothing reads them). Every row then sees exactly the tokens it would see alone.
        """
        if not bool((key_valid[:, 1:] >= key_valid[:, :-1]).all()):
            raise ValueError("pad-free forward needs left padding (attention_mask False...True in every row)")
        pads = (~key_valid).sum(dim=1)
        groups = pads.unique().tolist()
        out: torch.Tensor | None = None
        for i in range(self.agreed_passes(len(groups))):
            pad = groups[min(i, len(groups) - 1)]
            rows = (pads == pad).nonzero().squeeze(1)
            logits, _ = self._forward(input_ids[rows, pad:], None, None, None, False)
            if out is None:
                out = logits.new_zeros(*input_ids.shape, logits.shape[-1])
            if i < len(groups):
                out[rows, pad:] = logits
            else:  # a repeated pass that only keeps the processes in step (agreed_passes): it counts 0
                out = out + 0 * logits.sum()
        assert out is not None
        return out

    def agreed_passes(self, count: int) -> int:
        """How many forward passes to make in a loop whose length depends on the data (pad-free groups, estimator
        chunks): ``count``, or under FSDP across processes the largest ``count`` of any process.

        Why: every forward pass of a sharded model gathers its weights from all processes (and its backward
        scatters the gradients), so a process that made fewer passes would leave the others waiting forever. The
        callers repeat one of their real passes for the extra ones and add it with weight 0, so results and
        gradients are unchanged while every process makes the same collective calls.
        """
        if not self.sharded:
            return count
        agreed = torch.tensor([count], device=self.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        return int(agreed)

    @property
    def sharded(self) -> bool:
        """Whether the wrapped module is sharded over several processes (FSDP2): each forward pass is a collective."""
        from torch.distributed.fsdp import FSDPModule

        return isinstance(self.model, FSDPModule) and dist.is_initialized() and dist.get_world_size() > 1

    def forward_cached(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        cache: Any,
        store: bool,
        keep: slice | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """Like :meth:`logits` but against cached keys/values (exact for block attention, see ``full_cache_modes``).

        The cache is opaque to callers: pass None first, then what the last storing call returned (or
        :meth:`select_cache_rows` / :meth:`select_cache_positions` of it). ``attention_mask`` is a boolean
        [B, 1, Q, K] pattern over the cached keys followed by these ones. ``keep`` as in :meth:`logits`.
        """
        if not (self.supports_kv_cache or self.full_cache_modes):
            raise NotImplementedError(f"the {self.family} backend has no KV cache")
        raw = self._kept_head(keep, input_ids.shape[1])
        if raw is not None:
            return self._forward(input_ids, attention_mask, position_ids, cache, store, keep=raw)
        logits, cache = self._forward(input_ids, attention_mask, position_ids, cache, store)
        return self._shift(logits) if keep is None else self._shift(logits)[:, keep], cache

    def select_cache_rows(self, cache: Any, keep: torch.Tensor) -> Any:
        """The cache restricted to the rows flagged in ``keep`` (rows that stopped decoding leave the batch)."""
        return [(k[keep], v[keep]) for k, v in cache]

    def select_cache_positions(self, cache: Any, positions: torch.Tensor) -> Any:
        """The cache restricted to the key positions listed in ``positions`` [K'] (in that order).

        Full-attention decoding stores every position once per block, then keeps the ones it does not forward.
        """
        return [(k[:, :, positions], v[:, :, positions]) for k, v in cache]

    def context_attention(self, prompt_mask: torch.Tensor, completion_len: int) -> torch.Tensor:
        """Attention for ``[prompt | completion]`` rows: key padding (full models) or block-causal (block models)."""
        batch = prompt_mask.shape[0]
        ones = torch.ones(batch, completion_len, dtype=torch.bool, device=prompt_mask.device)
        key_valid = torch.cat((prompt_mask.bool(), ones), dim=1)
        if self.attention == "block":
            return block_causal_mask(key_valid, prompt_mask.shape[1], int(self.block_size))
        return key_valid

    def _shift(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.shift_logits:
            return logits
        return torch.cat((logits[:, :1], logits[:, :-1]), dim=1)

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights (through any DDP/FSDP wrapper, which ``nn.Module`` has no ``dtype`` for)."""
        return next(self.model.parameters()).dtype

    def decoder_blocks(self) -> list[nn.Module]:
        """The model's repeated decoder blocks (instances of :attr:`block_classes`), in order.

        One clear error when there are none: activation checkpointing and FSDP's wrap policy both need them, and
        a model file whose block class is named differently would otherwise train unsharded or without
        checkpointing in silence.
        """
        # by every class of the module's type: FSDP2 turns ``Block`` into a subclass named ``FSDPBlock``
        wanted = set(self.block_classes)
        blocks = [m for m in self.model.modules() if any(c.__name__ in wanted for c in type(m).__mro__)]
        if not blocks:
            found = sorted({type(m).__name__ for m in self.model.modules()})
            raise UserError(
                f"model {self.name!r} has no decoder block of the {self.family} family's classes "
                f"{list(self.block_classes)} (its modules: {', '.join(found[:12])}...)"
            )
        return blocks

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model's position encoding covers, when its config says (None: no limit known)."""
        config = getattr(getattr(self.model, "module", self.model), "config", None)
        for name in ("max_position_embeddings", "max_sequence_length"):  # transformers' name, LLaDA's
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    @property
    def vocab_size(self) -> int:
        return int(getattr(self.model, "module", self.model).config.vocab_size)  # through a DDP wrapper

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
            "pad_free": self.pad_free,
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

    def response_lengths(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """Tokens before the first stop token of each row (the whole canvas if there is none), [B] long."""
        is_stop = torch.isin(completion_ids, torch.tensor(self.stop_ids, device=completion_ids.device))
        return self.completion_mask(completion_ids).sum(dim=1) - is_stop.any(dim=1).long()

    def decode(self, completion_ids: torch.Tensor) -> list[str]:
        """Completion text cut at the first stop token, special tokens removed."""
        keep = self.completion_mask(completion_ids)
        texts = []
        for row, valid in zip(completion_ids.tolist(), keep.tolist(), strict=True):
            tokens = [t for t, v in zip(row, valid, strict=True) if v and t not in self.stop_ids]
            texts.append(self.tokenizer.decode(tokens, skip_special_tokens=True))
        return texts
