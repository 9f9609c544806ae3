"""Probes of the conventions the harness relies on, measured on a loaded model (``check-model``).

Every sampler, estimator and evaluator trusts a handful of facts about the model behind a backend: which id
is MASK, that padding changes nothing, that attention is bidirectional (or block-causal without leakage),
that logit t predicts token t, that a KV cache gives what recomputation gives, and that train mode still
returns logits. Published modeling files break these in quiet ways (a mask silently ignored, a 2-D mask
that turns the model causal, a train-mode forward without logits), and nothing fails: scores are just wrong.
Each probe here runs a few forward passes of a short text through the *backend* (the same calls the harness
makes) and reports what it measured, so a failure is visible before any GPU hour is spent.

Tolerances follow the model's dtype (:func:`noise_floor`): "unchanged" means within numerical noise of the
logits' scale, "changed" means well above it.
"""

from __future__ import annotations

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
    """The largest logit difference still counted as numerical noise for logits of magnitude ``scale``."""
    relative = 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2
    return relative * max(1.0, scale)


def probe_ids(dlm: DiffusionLM, length: int) -> torch.Tensor:
    """[1, length] ids of ordinary text (special tokens and MASK excluded), repeated as needed."""
    ids = [i for i in dlm.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"] if i != dlm.mask_id]
    special = set(dlm.tokenizer.all_special_ids)
    ids = [i for i in ids if i not in special] or [0]
    while len(ids) < length:
        ids = ids + ids
    return torch.tensor([ids[:length]], device=dlm.device)


def _dtype(dlm: DiffusionLM) -> torch.dtype:
    return next(dlm.model.parameters()).dtype


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


def masks_honoured(dlm: DiffusionLM) -> Probe:
    """Whether the model honours attention masks (full-attention models that do not are run pad-free)."""
    to_removed, to_unmasked = mask_effect(dlm)
    honoured = to_removed < to_unmasked
    if honoured:
        status, meaning = "pass", "masks work; padded batches are masked"
    elif dlm.attention == "full":
        status, meaning = "n/a", "the model ignores attention masks; the harness runs it pad-free (no pad is ever seen)"
    else:
        status, meaning = "fail", "a block-diffusion model must honour its block-causal mask"
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


@torch.no_grad()
def attention_pattern(dlm: DiffusionLM) -> list[Probe]:
    """Full models: bidirectional (also with padding). Block models: no leakage from later blocks, bidirectional
    inside a block."""
    if dlm.attention == "full":
        ids = probe_ids(dlm, 8)
        batch = torch.cat((torch.full_like(ids[:, :2], dlm.pad_id), ids), dim=1)
        key_valid = torch.ones_like(batch, dtype=torch.bool)
        key_valid[:, :2] = False
        changed = batch.clone()
        changed[0, -1] = dlm.mask_id
        base = _pattern_logits(dlm, batch, key_valid)[0, 2]
        diff = _max_diff(base, _pattern_logits(dlm, changed, key_valid)[0, 2])
        floor = noise_floor(_dtype(dlm), float(base.abs().max()))
        return [
            Probe(
                "bidirectional attention",
                _status(diff > floor),
                f"first token's logits move by {diff:.2g} when the last token changes (padded batch)",
                "every position sees the whole canvas" if diff > floor else "the model is causal under this call",
            )
        ]
    block = int(dlm.block_size)
    ids = probe_ids(dlm, 3 * block)
    key_valid = torch.ones_like(ids, dtype=torch.bool)
    base = _pattern_logits(dlm, ids, key_valid)[0]
    floor = noise_floor(_dtype(dlm), float(base.abs().max()))
    later = ids.clone()
    later[0, 2 * block :] = dlm.mask_id
    leak = _max_diff(base[: 2 * block], _pattern_logits(dlm, later, key_valid)[0, : 2 * block])
    inside = ids.clone()
    inside[0, 2 * block - 1] = dlm.mask_id
    within = _max_diff(base[block], _pattern_logits(dlm, inside, key_valid)[0, block])
    return [
        Probe(
            "no leakage between blocks",
            _status(leak <= floor),
            f"blocks 0-1 move by {leak:.2g} when block 2 changes (noise floor {floor:.2g})",
            "a block never sees later blocks",
        ),
        Probe(
            "bidirectional inside a block",
            _status(within > floor),
            f"a block's first token moves by {within:.2g} when its last token changes",
            "tokens of one block see each other",
        ),
    ]


@torch.no_grad()
def logit_alignment(dlm: DiffusionLM) -> Probe:
    """Masked tokens of a plain sentence are predicted at their own position, not one off (Dream's shift).

    Fails only when a neighbouring position clearly predicts the token better; inconclusive (``n/a``) when no
    position does, e.g. with random weights.
    """
    length = 4 * (dlm.block_size or 8)
    ids = probe_ids(dlm, length)
    targets = torch.arange(2, length - 1, 3, device=ids.device)
    masked = ids.clone()
    masked[0, targets] = dlm.mask_id
    logp = torch.log_softmax(_pattern_logits(dlm, masked, torch.ones_like(ids, dtype=torch.bool))[0].float(), -1)
    truth = ids[0, targets]
    aligned, before, after = (float(logp[targets + d, truth].mean()) for d in (0, -1, 1))
    measured = f"mean log p(masked token): {aligned:.2f} at its position, {before:.2f} / {after:.2f} one off"
    if max(before, after) > aligned + 0.5:
        return Probe("logit alignment", "fail", measured, "logits are read one position off")
    if aligned > max(before, after) + 0.5:
        return Probe("logit alignment", "pass", measured, "logit t predicts token t")
    return Probe("logit alignment", "n/a", measured, "inconclusive: the model does not know this text")


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
