"""Attention patterns shared by samplers, estimators and trainers.

All masks are boolean with True = "may attend", shaped [B, 1, Q, K] (or [B, K] for key padding).

Positions skip left padding (:func:`real_positions`): a token's position is its index among the real tokens of
its row, so padding a prompt never moves it. Rotary embeddings depend only on position differences, so this
changes nothing in exact arithmetic, but it keeps each row's inputs bit-identical whatever it is batched with,
and it is Dream's own convention for padded batches (``cumsum(mask) - 1``).

Block diffusion (SDAR/TraDo style) numbers the response blocks 0, 1, ... from the first response position and
the prompt blocks -1, -2, ... backwards from the end of the prompt (blocks aligned to the end of the prompt,
as dLLM-RL does), so left padding never changes which tokens share a block. A query attends to every key whose
block index is at most its own: bidirectional inside a block, causal across blocks.
"""

from __future__ import annotations

import torch


def real_positions(key_valid: torch.Tensor) -> torch.Tensor:
    """[B, T] position of each token among the real tokens of its row (``cumsum(valid) - 1``; 0 at padding)."""
    return (key_valid.long().cumsum(dim=-1) - 1).clamp(min=0)


def block_index(total_len: int, prompt_len: int, block_size: int, device: torch.device | None = None) -> torch.Tensor:
    """Block id of every position of a [prompt | response] row: floor((pos - prompt_len) / block_size)."""
    pos = torch.arange(total_len, device=device)
    return torch.div(pos - prompt_len, block_size, rounding_mode="floor")


def block_causal_mask(key_valid: torch.Tensor, prompt_len: int, block_size: int) -> torch.Tensor:
    """[B, 1, T, T] block-causal mask for rows [prompt (left-padded, length prompt_len) | response].

    ``key_valid`` [B, T] is False at padding positions, which no query may attend to.
    """
    total = key_valid.shape[1]
    blk = block_index(total, prompt_len, block_size, key_valid.device)
    allowed = blk[None, :] <= blk[:, None]  # [Q, K]
    return allowed[None, None] & key_valid[:, None, None, :].bool()


def staircase_mask(prompt_valid: torch.Tensor, response_len: int, block_size: int) -> torch.Tensor:
    """[B, 1, P+2L, P+2L] mask for the staircase input [prompt | clean response | noisy response].

    * prompt rows and clean-response rows: block-causal over [prompt | clean], exactly the context the
      block-diffusion sampler builds;
    * noisy block b: the prompt, the clean blocks strictly before b, and its own noisy block (bidirectional).

    One forward pass then yields log p(y_b | x, y_<b, z_b) for every block b at once, with no leakage from
    later blocks (StableDRL's staircase attention; the BD3-LM / SDAR training mask).
    """
    batch, p_len = prompt_valid.shape
    dev = prompt_valid.device
    l_len = response_len
    ctx_blk = block_index(p_len + l_len, p_len, block_size, dev)  # prompt + clean
    noisy_blk = torch.div(torch.arange(l_len, device=dev), block_size, rounding_mode="floor")
    total = p_len + 2 * l_len
    allowed = torch.zeros(total, total, dtype=torch.bool, device=dev)
    ctx = slice(0, p_len + l_len)
    noisy = slice(p_len + l_len, total)
    allowed[ctx, ctx] = ctx_blk[None, :] <= ctx_blk[:, None]
    allowed[noisy, ctx] = ctx_blk[None, :] < noisy_blk[:, None]
    allowed[noisy, noisy] = noisy_blk[None, :] == noisy_blk[:, None]
    key_valid = torch.cat((prompt_valid.bool(), torch.ones(batch, 2 * l_len, dtype=torch.bool, device=dev)), dim=1)
    return allowed[None, None] & key_valid[:, None, None, :]


def staircase_position_ids(prompt_valid: torch.Tensor, response_len: int) -> torch.Tensor:
    """Position ids for [prompt | clean | noisy]: real-token positions; the noisy copy reuses the clean ones."""
    batch = prompt_valid.shape[0]
    ones = torch.ones(batch, response_len, dtype=torch.bool, device=prompt_valid.device)
    ctx_pos = real_positions(torch.cat((prompt_valid.bool(), ones), dim=1))
    return torch.cat((ctx_pos, ctx_pos[:, prompt_valid.shape[1] :]), dim=1)
