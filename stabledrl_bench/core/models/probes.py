"""Probes of the conventions the harness relies on, measured on a loaded model (``check-model``).

Every sampler, estimator and evaluator trusts a handful of facts about the model behind a backend: which id
is MASK, that padding changes nothing, that attention is bidirectional (or block-causal without leakage),
that logit t predicts token t, that a KV cache gives what recomputation gives, and that train mode still
returns logits. Published modeling files break these in quiet ways (a mask silently ignored, a 2-D mask
that turns the model causal, a train-mode forward without logits), and nothing fails: scores are just wrong.
Each probe here runs a few forward passes of a short text through the *backend* (the same calls the harness
makes) and reports what it measured, so a failure is visible before any GPU hour is spent.

**How each probe decides, and why a conforming model cannot fail it.** A probe that fails stops ``train`` and
``reproduce``, so every verdict comes with a bound on how often it could be wrong about a model that follows the
convention, with weights of any scale, random ones included; where the measurement cannot reach that bound the
verdict is ``n/a`` (inconclusive), never ``fail``. There are three kinds of test:

* **Equalities** (padding invariance, no leakage between blocks, KV cache = recomputation, train mode = eval mode,
  activation checkpointing). A conforming model computes the same numbers both ways in exact arithmetic, so the
  only difference is float rounding, and the tolerance (:func:`noise_floor`: 1e-4 of the logits' scale, and at
  least 1e-4, in float32; 3e-2 in 16-bit floats) is some hundred times the rounding of a forward pass. No
  statistics: a conforming model fails only if its rounding exceeds that, at any weight scale (the tolerance
  grows with the logits).
* **Dependencies** (bidirectional attention, bidirectional inside a block, the attention mask honoured). The
  forbidden direction of a broken model is exactly zero (masked keys get weight exactly 0), while a conforming
  model's dependence is only small when its weights are. So a dependence counts as absent only when it is at the
  level of rounding (:func:`rounding_floor`, 1e-6 of the logits' scale in float32) while the same change, seen
  from a position that may see it in either case, moves the logits at least :data:`REFERENCE_FACTOR` times more
  (:func:`dependence`). Both directions pass through the same attention with the roles of the two tokens swapped,
  so on a conforming model the ratio of the two effects is of order one: a false ``fail`` needs it below
  1 / :data:`REFERENCE_FACTOR`. Weights so small that neither effect clears rounding give ``n/a``; every later
  token is changed at once, so that saturated attention (large weights: one key takes all the weight) still shows
  a dependence when the first token attends to any of them.
  ``tests/test_probes.py`` measures the ratio on random native LLaDA, Dream and SDAR networks at two weight
  scales over many seeds.
* **A statistical test** (logit alignment, :func:`alignment_verdict`): a one-sided binomial test at level
  :data:`ALIGNMENT_ALPHA`, stated there.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

import torch

from stabledrl_bench.core.masks import block_causal_mask, real_positions
from stabledrl_bench.core.models.checkpointing import disable_activation_checkpointing, enable_activation_checkpointing
from stabledrl_bench.core.models.interface import DiffusionLM
from stabledrl_bench.errors import UserError

PROBE_TEXT = (
    "The quick brown fox jumps over the lazy dog. Then it counts: one, two, three, four, five, six, seven. "
    "A train leaves the station at noon and travels sixty miles per hour for three hours."
)


@dataclass
class Probe:
    """One measured convention: ``status`` is ``pass``, ``fail`` or ``n/a`` (not applicable or inconclusive)."""

    name: str
    status: str
    measured: str
    meaning: str

    @property
    def passed(self) -> bool:
        return self.status != "fail"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _status(ok: bool) -> str:
    return "pass" if ok else "fail"


def noise_floor(dtype: torch.dtype, scale: float) -> float:
    """The largest logit difference still counted as numerical noise for logits of magnitude ``scale`` (the
    tolerance of the equality probes: some hundred times a forward pass's rounding)."""
    relative = 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2
    return relative * max(1.0, scale)


def rounding_floor(dtype: torch.dtype, scale: float) -> float:
    """The largest logit change that is still float rounding for logits of magnitude ``scale`` (a dependence
    below it counts as absent, :func:`dependence`): about ten times the unit roundoff of ``dtype``."""
    relative = 1e-6 if dtype in (torch.float32, torch.float64) else 1e-2
    return relative * scale


# A dependence counts as absent only when the reference effect is at least this many times the rounding floor.
REFERENCE_FACTOR = 100


def dependence(effect: float, reference: float, floor: float) -> str:
    """``present`` when ``effect`` is above rounding (``floor``); ``absent`` when it is at rounding while
    ``reference``, the same change seen where it is allowed in every case, is :data:`REFERENCE_FACTOR` times above
    it; ``unknown`` otherwise (the weights are too small for the change to show at all)."""
    if effect > floor:
        return "present"
    return "absent" if reference > REFERENCE_FACTOR * floor else "unknown"


def probe_ids(dlm: DiffusionLM, length: int) -> torch.Tensor:
    """[1, length] ids of ordinary text (special tokens and MASK excluded), repeated as needed."""
    ids = [i for i in dlm.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"] if i != dlm.mask_id]
    special = set(dlm.tokenizer.all_special_ids)
    ids = [i for i in ids if i not in special] or [0]
    while len(ids) < length:
        ids = ids + ids
    return torch.tensor([ids[:length]], device=dlm.device)


def _dtype(dlm: DiffusionLM) -> torch.dtype:
    """The dtype the forward passes compute in (the probes' tolerances follow its rounding)."""
    return dlm.compute_dtype or next(dlm.model.parameters()).dtype


def _pattern_logits(dlm: DiffusionLM, ids: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """Logits through the call the harness makes: key padding (full) or block-causal over the whole row (block)."""
    if dlm.attention == "block":
        mask = block_causal_mask(key_valid, ids.shape[1], int(dlm.block_size))
        return dlm.logits(ids, mask, real_positions(key_valid))
    return dlm.logits(ids, key_valid)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


@torch.no_grad()
def mask_effect(dlm: DiffusionLM) -> tuple[float, float]:
    """How far blocking a key moves the logits from (dropping that token, not masking at all).

    Scale-free: a model that honours the mask gives (nearly) what it gives without the token; one that ignores
    it gives exactly its unmasked logits.
    """
    ids = probe_ids(dlm, 8)
    full = torch.ones(1, 1, 8, 8, dtype=torch.bool, device=ids.device)
    blocked = full.clone()
    blocked[..., 1:, 0] = False
    positions = torch.arange(8, device=ids.device)[None]
    unmasked = dlm._forward(ids, full, positions, None, False)[0][:, 1:]
    masked = dlm._forward(ids, blocked, positions, None, False)[0][:, 1:]
    removed = dlm._forward(ids[:, 1:], full[..., 1:, 1:], positions[:, 1:] - 1, None, False)[0]
    return _max_diff(masked, removed), _max_diff(masked, unmasked)


@torch.no_grad()
def masks_honoured(dlm: DiffusionLM) -> Probe:
    """Whether the model honours attention masks (full-attention models that do not are run pad-free).

    A dependence test (module docstring): the mask is ignored when blocking the key leaves the logits exactly as
    without the mask while dropping the token moves them; honoured when blocking equals dropping (to the equality
    tolerance) and the key does matter."""
    to_removed, to_unmasked = mask_effect(dlm)
    ids = probe_ids(dlm, 8)
    scale = float(_pattern_logits(dlm, ids, torch.ones_like(ids, dtype=torch.bool)).abs().max())
    rounding = rounding_floor(_dtype(dlm), scale)
    ignored = dependence(to_unmasked, to_removed, rounding) == "absent"
    honoured = to_removed <= noise_floor(_dtype(dlm), scale) and rounding < to_unmasked and to_removed < to_unmasked
    if honoured:
        status, meaning = "pass", "masks work; padded batches are masked"
    elif ignored and dlm.attention == "full":
        status, meaning = "n/a", "the model ignores attention masks; the harness runs it pad-free (no pad is ever seen)"
    elif ignored:
        status, meaning = "fail", "a block-diffusion model must honour its block-causal mask"
    else:
        status, meaning = "n/a", "inconclusive: the blocked key changes too little to tell at this weight scale"
    measured = f"blocked key: {to_removed:.2g} from dropping the token, {to_unmasked:.2g} from no mask"
    return Probe("attention mask honoured", status, measured, meaning)


@torch.no_grad()
def padding_invariance(dlm: DiffusionLM) -> Probe:
    """A left-padded row in a batch gives the logits of the same row alone.

    The first real token is left out: nothing predicts it (a shifted model reads it off the last pad).
    """
    ids = probe_ids(dlm, 12)
    short = ids[:, 3:]
    batch = torch.cat((ids, torch.cat((torch.full_like(ids[:, :3], dlm.pad_id), short), dim=1)))
    key_valid = torch.ones_like(batch, dtype=torch.bool)
    key_valid[1, :3] = False
    padded = _pattern_logits(dlm, batch, key_valid)[1, 4:]
    alone = _pattern_logits(dlm, short, torch.ones_like(short, dtype=torch.bool))[0, 1:]
    diff = _max_diff(padded, alone)
    floor = noise_floor(_dtype(dlm), float(alone.abs().max()))
    how = "pad-free" if dlm.pad_free else "masked"
    return Probe(
        "padding invariance",
        _status(diff <= floor),
        f"max |logit difference| {diff:.2g} ({how}; noise floor {floor:.2g})",
        "results do not depend on which prompts share a batch",
    )


def _moved(dlm: DiffusionLM, ids, key_valid, base: torch.Tensor, changed: slice, seen: slice) -> float:
    """How far the logits at ``seen`` move when the tokens at ``changed`` become MASK (``base``: unchanged logits)."""
    edited = ids.clone()
    edited[0, changed] = dlm.mask_id
    return _max_diff(base[0, seen], _pattern_logits(dlm, edited, key_valid)[0, seen])


def two_way_effects(dlm: DiffusionLM, ids, key_valid, first: int, end: int) -> tuple[float, float, float]:
    """(backward, forward, rounding floor) of :func:`_two_way`: how far ``first``'s logits move when every later
    token up to ``end`` changes, how far the later ones move when ``first`` changes, and the rounding level."""
    base = _pattern_logits(dlm, ids, key_valid)
    later = slice(first + 1, end)
    backward = _moved(dlm, ids, key_valid, base, later, slice(first, first + 1))
    forward = _moved(dlm, ids, key_valid, base, slice(first, first + 1), later)
    return backward, forward, rounding_floor(_dtype(dlm), float(base[0, first:end].abs().max()))


def _two_way(dlm: DiffusionLM, name: str, ids, key_valid, first: int, end: int, meaning: str) -> Probe:
    """Whether position ``first`` sees the positions after it up to ``end``: a dependence test (module docstring) of
    the backward effect (every later token changed at once) against the forward one (the first token changed, seen
    from every later position), which every attention allows. Changing them all at once matters when attention is
    saturated (large weights): one later key that the first token attends to is then enough."""
    backward, forward, floor = two_way_effects(dlm, ids, key_valid, first, end)
    found = dependence(backward, forward, floor)
    status, said = {
        "present": ("pass", meaning),
        "absent": ("fail", "the model is causal under this call"),
        "unknown": ("n/a", "inconclusive: tokens barely affect one another at this weight scale"),
    }[found]
    measured = f"first token moves by {backward:.2g} when the later ones change, the later ones by {forward:.2g} "
    measured += (
        f"when it changes (rounding {floor:.2g}; absent: at rounding while the other way is {REFERENCE_FACTOR}x)"
    )
    return Probe(name, status, measured, said)


@torch.no_grad()
def attention_pattern(dlm: DiffusionLM) -> list[Probe]:
    """Full models: bidirectional (also with padding). Block models: no leakage from later blocks, bidirectional
    inside a block."""
    if dlm.attention == "full":
        ids = probe_ids(dlm, 8)
        batch = torch.cat((torch.full_like(ids[:, :2], dlm.pad_id), ids), dim=1)
        key_valid = torch.ones_like(batch, dtype=torch.bool)
        key_valid[:, :2] = False
        meaning = "every position sees the whole canvas"
        return [_two_way(dlm, "bidirectional attention", batch, key_valid, 2, batch.shape[1], meaning)]
    block = int(dlm.block_size)
    ids = probe_ids(dlm, 3 * block)
    key_valid = torch.ones_like(ids, dtype=torch.bool)
    base = _pattern_logits(dlm, ids, key_valid)[0]
    floor = noise_floor(_dtype(dlm), float(base.abs().max()))
    later = ids.clone()
    later[0, 2 * block :] = dlm.mask_id
    leak = _max_diff(base[: 2 * block], _pattern_logits(dlm, later, key_valid)[0, : 2 * block])
    inside = "tokens of one block see each other"
    return [
        Probe(
            "no leakage between blocks",
            _status(leak <= floor),
            f"blocks 0-1 move by {leak:.2g} when block 2 changes (noise floor {floor:.2g})",
            "a block never sees later blocks",
        ),
        _two_way(dlm, "bidirectional inside a block", ids, key_valid, block, 2 * block, inside),
    ]


# Logit alignment's test: at most this probability of a wrong verdict on a model that does not know the text (random
# weights of any scale), and the share of the vocabulary a token must rank in at a position to count as predicted.
ALIGNMENT_ALPHA = 1e-3
TOP_SHARE = 0.01
ALIGNMENT_LENGTH = 48  # tokens of the probe text (rounded up to whole blocks)


def alignment_targets(ids: list[int]) -> list[int]:
    """The positions whose token is masked for :func:`logit_alignment`: tokens that occur once in the text (so
    that no copy of a target is visible anywhere), neither at the ends nor next to another target (so that every
    target's neighbours are visible tokens), taken left to right."""
    counts = Counter(ids)
    targets: list[int] = []
    for position in range(1, len(ids) - 1):
        if counts[ids[position]] == 1 and (not targets or position - targets[-1] > 1):
            targets.append(position)
    return targets


def binomial_threshold(n: int, p: float, alpha: float) -> int:
    """The smallest count c with P(Binomial(n, p) >= c) <= alpha (n + 1 when no count reaches it)."""
    tail = 1.0
    for c in range(n + 1):
        if tail <= alpha:
            return c
        tail -= math.comb(n, c) * p**c * (1 - p) ** (n - c)  # now P(>= c + 1)
    return n + 1


def alignment_hits(logits: torch.Tensor, ids: list[int], targets: list[int]) -> dict[int, torch.Tensor]:
    """For each reading (offset -1, 0, +1 from the target), how many targets rank among the top
    ``max(1, round(TOP_SHARE * V))`` of the logits [..., L, V] there (the statistic of :func:`alignment_verdict`;
    leading dimensions are kept, e.g. many draws at once)."""
    top = max(1, round(TOP_SHARE * logits.shape[-1]))
    positions = torch.tensor(targets, device=logits.device, dtype=torch.long)
    truth = torch.tensor([ids[t] for t in targets], device=logits.device, dtype=torch.long)
    hits = {}
    for offset in (-1, 0, 1):
        rows = logits[..., positions + offset, :].float()
        target = rows.gather(-1, truth.expand(*rows.shape[:-2], -1)[..., None])
        above = (rows > target).sum(-1)  # tokens ranked strictly above the target
        hits[offset] = (above < top).sum(-1)
    return hits


def alignment_decision(hits: dict[int, int], needed: int) -> str:
    """``fail`` when a one-off reading reaches ``needed`` and beats the aligned one, ``pass`` when the aligned
    reading reaches it and beats both, else ``n/a`` (:func:`alignment_verdict`)."""
    off = max(hits[-1], hits[1])
    if off >= needed and off > hits[0]:
        return "fail"
    if hits[0] >= needed and hits[0] > off:
        return "pass"
    return "n/a"


def alignment_verdict(logits: torch.Tensor, ids: list[int], targets: list[int]) -> Probe:
    """The logit-alignment verdict from the logits [L, V] of ``ids`` with the ``targets`` masked.

    The statistic: for each reading (the target's own position, one before, one after), the number of targets
    whose token ranks among the top ``k = max(1, round(TOP_SHARE * V))`` logits there. On a model that does not know
    the text -- random weights, at any scale -- a target's rank at any position is uniform over the vocabulary: the
    output rows are exchangeable, and no copy of a target is visible (so tied embeddings cannot favour it either;
    a visible token's boost only pushes the target down). Each count is then at most Binomial(n, k / V) in its tail
    (distinct targets in one ranking are drawn without replacement, whose tail the binomial dominates), so a count
    reaching ``c``, the smallest with ``P(Binomial(n, k/V) >= c) <= ALIGNMENT_ALPHA / 2``, has probability at most
    ``ALIGNMENT_ALPHA / 2`` under chance. ``fail``: a one-off reading reaches ``c`` and beats the aligned one
    (false-fail probability at most ``ALIGNMENT_ALPHA``, both neighbours counted); ``pass``: the aligned reading
    reaches ``c`` and beats both one-off readings; else ``n/a``.
    """
    vocab = logits.shape[-1]
    top = max(1, round(TOP_SHARE * vocab))
    n = len(targets)
    needed = binomial_threshold(n, top / vocab, ALIGNMENT_ALPHA / 2)
    hits = {offset: int(count) for offset, count in alignment_hits(logits, ids, targets).items()}
    measured = (
        f"{hits[0]}/{n} masked tokens in their position's top {top} of {vocab} logits, {hits[-1]} / {hits[1]} one "
        f"off; {needed} needed (chance {top / vocab:.2g} each, false verdict <= {ALIGNMENT_ALPHA:g})"
    )
    status = alignment_decision(hits, needed)
    meaning = {
        "fail": "logits are read one position off",
        "pass": "logit t predicts token t",
        "n/a": "inconclusive: the model does not know this text at any offset",
    }[status]
    return Probe("logit alignment", status, measured, meaning)


@torch.no_grad()
def logit_alignment(dlm: DiffusionLM) -> Probe:
    """Masked tokens of a plain sentence are predicted at their own position, not one off (Dream's shift): a
    binomial test of how often each reading ranks the masked token near the top (:func:`alignment_verdict`), so that
    a model that does not know the text (random weights) is ``n/a`` except with probability ``ALIGNMENT_ALPHA``."""
    block = dlm.block_size or 1
    ids = probe_ids(dlm, block * math.ceil(ALIGNMENT_LENGTH / block))
    tokens = ids[0].tolist()
    targets = alignment_targets(tokens)
    masked = ids.clone()
    masked[0, targets] = dlm.mask_id
    logits = _pattern_logits(dlm, masked, torch.ones_like(ids, dtype=torch.bool))[0]
    return alignment_verdict(logits, tokens, targets)


@torch.no_grad()
def cache_matches(dlm: DiffusionLM) -> Probe:
    """Block decoding against the model's KV cache gives the logits of recomputing the prefix."""
    if dlm.attention != "block" or not dlm.supports_kv_cache:
        return Probe("KV cache = recomputation", "n/a", "no KV cache used for this model", "")
    block = int(dlm.block_size)
    ids = probe_ids(dlm, 3 * block)
    ids[0, 2 * block + 1 :] = dlm.mask_id
    key_valid = torch.ones_like(ids, dtype=torch.bool)
    positions = real_positions(key_valid)
    full = _pattern_logits(dlm, ids, key_valid)[0, 2 * block :]
    cache = None
    for start in (0, block):  # store blocks 0 and 1, then query block 2 against them
        span = slice(start, start + block)
        mask = torch.ones(1, 1, block, start + block, dtype=torch.bool, device=ids.device)
        _, cache = dlm.forward_cached(ids[:, span], mask, positions[:, span], cache, store=True)
    query = torch.ones(1, 1, block, 3 * block, dtype=torch.bool, device=ids.device)
    cached, _ = dlm.forward_cached(ids[:, 2 * block :], query, positions[:, 2 * block :], cache, store=False)
    diff = _max_diff(cached[0], full)
    floor = noise_floor(_dtype(dlm), float(full.abs().max()))
    return Probe(
        "KV cache = recomputation",
        _status(diff <= floor),
        f"max |logit difference| {diff:.2g} (noise floor {floor:.2g})",
        "cached block decoding is exact",
    )


def train_mode_logits(dlm: DiffusionLM) -> Probe:
    """In train mode the backend still returns logits, equal to eval mode's, with gradients to the weights."""
    model = dlm.model
    was_training = model.training
    ids = probe_ids(dlm, 2 * (dlm.block_size or 4))
    key_valid = torch.ones_like(ids, dtype=torch.bool)
    try:
        with torch.no_grad():
            model.eval()
            reference = _pattern_logits(dlm, ids, key_valid)
        model.train()
        try:
            logits = _pattern_logits(dlm, ids, key_valid)
        except Exception as exc:  # the point of the probe: report how the train-mode forward fails
            return Probe("train-mode forward", "fail", f"{type(exc).__name__}: {exc}", "RL steps cannot run")
        params = [p for p in model.parameters() if p.requires_grad]
        grads = _leaves_reached(logits)
        diff = _max_diff(logits.detach(), reference)
        floor = noise_floor(_dtype(dlm), float(reference.abs().max()))
        ok = bool(torch.isfinite(logits).all()) and grads > 0 and diff <= floor
        return Probe(
            "train-mode forward",
            _status(ok),
            f"logits {diff:.2g} from eval mode; gradient reaches {grads}/{len(params)} tensors",
            "RL steps see the policy the sampler sees",
        )
    finally:
        model.train(was_training)


def _leaves_reached(output: torch.Tensor) -> int:
    """How many leaf tensors (weights) ``output``'s autograd graph reaches: which weights a backward pass would give
    a gradient, found without running one (a backward through a DDP, FSDP or DeepSpeed model fires their gradient
    hooks and collectives, and leaves gradients the first training step would add to)."""
    leaves: set[int] = set()
    seen: set[int] = set()
    stack = [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if hasattr(node, "variable"):
            leaves.add(id(node.variable))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return len(leaves)


def decoder_blocks(dlm: DiffusionLM) -> Probe:
    """The family's decoder blocks exist in the model: the unit FSDP shards and activation checkpointing recomputes."""
    meaning = "FSDP wraps these blocks; activation checkpointing recomputes them"
    if not dlm.block_classes:
        return Probe("decoder blocks", "n/a", f"the {dlm.family} family declares no block class", meaning)
    try:
        blocks = dlm.decoder_blocks()
    except UserError as exc:
        return Probe("decoder blocks", "fail", str(exc), meaning)
    names = Counter(type(block).__name__ for block in blocks)
    return Probe("decoder blocks", "pass", ", ".join(f"{count} x {name}" for name, count in names.items()), meaning)


def activation_checkpointing(dlm: DiffusionLM) -> Probe:
    """With every decoder block recomputed in the backward pass, the train-mode loss and gradients are unchanged.

    Not part of the trainer's probes: it runs two backward passes, which under DeepSpeed would fire the engine's
    gradient hooks. ``check-model`` runs it on the model as loaded.
    """
    try:
        blocks = dlm.decoder_blocks()
    except UserError:
        return Probe("activation checkpointing", "n/a", "no decoder blocks found (see above)", "")
    model = dlm.model
    was_training = model.training
    ids = probe_ids(dlm, 2 * (dlm.block_size or 4))
    key_valid = torch.ones_like(ids, dtype=torch.bool)
    params = [p for p in blocks[0].parameters() if p.requires_grad]

    def loss_and_grads() -> tuple[float, list[torch.Tensor]]:
        loss = _pattern_logits(dlm, ids, key_valid).float().logsumexp(-1).mean()
        return float(loss.detach()), list(torch.autograd.grad(loss, params, allow_unused=True))

    try:
        model.train()
        plain_loss, plain = loss_and_grads()
        enable_activation_checkpointing(blocks)
        loss, grads = loss_and_grads()
    finally:
        disable_activation_checkpointing(blocks)
        model.train(was_training)
    diff = max((_max_diff(a, b) for a, b in zip(plain, grads, strict=True) if a is not None), default=0.0)
    scale = max((float(g.abs().max()) for g in plain if g is not None), default=0.0)
    floor = noise_floor(_dtype(dlm), scale)
    ok = abs(loss - plain_loss) <= noise_floor(_dtype(dlm), abs(plain_loss)) and diff <= floor
    return Probe(
        "activation checkpointing",
        _status(ok),
        f"loss {abs(loss - plain_loss):.2g} and first block's gradient {diff:.2g} from the plain pass",
        "training with gradient_checkpointing computes the same update",
    )


def mask_token(dlm: DiffusionLM) -> Probe:
    """The mask id exists in the vocabulary and is not a token the model also uses as EOS or padding."""
    vocab = dlm.vocab_size
    token = dlm.tokenizer.convert_ids_to_tokens(dlm.mask_id) if dlm.mask_id < len(dlm.tokenizer) else None
    ok = 0 <= dlm.mask_id < vocab and dlm.mask_id not in (dlm.eos_id, dlm.pad_id)
    return Probe(
        "mask token",
        _status(ok),
        f"id {dlm.mask_id} ({token!r}), vocabulary {vocab}, EOS {dlm.eos_id}, PAD {dlm.pad_id}",
        "MASK is a real embedding distinct from EOS/PAD",
    )


def run_probes(dlm: DiffusionLM, *, train: bool = True, checkpointing: bool = False) -> list[Probe]:
    """Every probe, in the order ``check-model`` prints them (``train=False`` skips the train-mode forward,
    ``checkpointing=True`` adds the backward passes of :func:`activation_checkpointing`).

    A probe whose forward pass raises is reported as failed with the error, so one broken call never hides
    the other measurements.
    """
    checks = [mask_token, masks_honoured, padding_invariance, attention_pattern, logit_alignment, cache_matches]
    if train:
        checks += [train_mode_logits, decoder_blocks]
    if checkpointing:
        checks.append(activation_checkpointing)
    probes: list[Probe] = []
    for check in checks:
        try:
            result = check(dlm)
        except Exception as exc:  # reported, not raised: see the docstring
            result = Probe(check.__name__.replace("_", " "), "fail", f"{type(exc).__name__}: {exc}", "")
        probes.extend(result if isinstance(result, list) else [result])
    return probes


def implementation(module: str) -> str:
    """Whose code runs the network: this package's (native, or the built-in tiny model) or the checkpoint's own."""
    if module.startswith("stabledrl_bench.core.models.tiny"):
        return "built-in tiny model"
    if module.startswith("stabledrl_bench."):
        return f"native ({module.rsplit('.', 1)[-1]}.py, no code from the folder)"
    return f"the checkpoint's own code ({module.rsplit('.', 1)[-1]}.py)"


def model_facts(dlm: DiffusionLM) -> dict[str, str]:
    """Family, attention, dtype and size of the loaded model (``check-model``; the plan adds what a preset needs)."""
    params = sum(p.numel() for p in dlm.model.parameters())
    module = type(getattr(dlm.model, "module", dlm.model)).__module__
    return {
        "family": dlm.family,
        "implementation": implementation(module),
        "attention": dlm.attention + (f" (block {dlm.block_size})" if dlm.block_size else ""),
        "dtype": str(_dtype(dlm)).replace("torch.", ""),
        "parameters": f"{params:,}",
    }


def require_conventions(dlm: DiffusionLM, model: str, *, train: bool = True) -> None:
    """Run the probes before training or evaluating; one clear error if any fails (``--skip-model-check``).

    The built-in tiny model in its own convention is exempt: its calling convention is this package's code, tested
    by the suite, and a weakly trained tiny model (e.g. the 0.1 M-parameter stress model) is too close to uniform
    on the probes' text for their verdicts to mean anything.
    """
    config = getattr(getattr(dlm.model, "module", dlm.model), "config", None)
    if dlm.family == "tiny" and getattr(config, "convention", None) == "native":
        return
    failed = [p for p in run_probes(dlm, train=train) if not p.passed]
    if failed:
        details = "; ".join(f"{p.name}: {p.measured}" for p in failed)
        raise UserError(
            f"model {model!r} breaks a convention the harness relies on ({details}); see "
            f"`python -m stabledrl_bench check-model --model {model}`, or pass --skip-model-check to train anyway"
        )
