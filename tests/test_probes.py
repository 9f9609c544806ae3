"""The convention probes cannot false-fail: each decides with a stated test (``core/models/probes.py``), or says n/a.

Three levels. Random native LLaDA, Dream and SDAR networks (the published structure, small) at two weight scales
over many seeds: no probe fails, and the two effects a dependence probe compares stay within a factor of a few of
each other, far from the ratio a false fail needs. The logit-alignment statistic itself over thousands of random
draws of a network's logits (untied and tied output heads): its counts stay within the binomial bound the test
assumes, so it false-fails (and false-passes) at most at its stated rate. And the probes still decide: a model that
knows the text passes, one that reads it one position off fails, and the refusal names the probe's numbers.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from stabledrl_bench.core.models import build_tiny, probes
from stabledrl_bench.core.models.backends import MODEL_FAMILIES, NATIVE, _wrap
from stabledrl_bench.core.models.convert import published_config
from stabledrl_bench.core.models.interface import DiffusionLM
from stabledrl_bench.errors import UserError

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
SCALES = (0.02, 0.2)  # the usual initialisation, and the scale the published-file tests draw their weights at
SEEDS = range(5)


@pytest.fixture(autouse=True)
def one_thread():
    """Networks this small gain nothing from intra-op threads, and lose much to them on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_network(family: str, scale: float, seed: int) -> DiffusionLM:
    """A native ``family`` network of the published structure with every weight matrix drawn N(0, scale^2)."""
    tiny = build_tiny(attention="block" if family == "sdar" else "full", block_size=4, **SMALL)
    native = NATIVE[family]
    fields = published_config(tiny.model.config, family)
    config = native.config(**{k: v for k, v in fields.items() if k not in ("auto_map", "architectures", "model_type")})
    model = native.model(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() >= 2:
                weight.copy_(scale * torch.randn(weight.shape, generator=generator))
    backend = MODEL_FAMILIES.get(native.backend)
    return _wrap(backend, model, tiny.tokenizer, config, config.mask_token_id, 4, name=family, probe=True)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_no_probe_fails_a_random_network_of_the_published_structure(family: str, scale: float) -> None:
    two_way = "bidirectional attention" if family != "sdar" else "bidirectional inside a block"
    ratios = []
    for seed in SEEDS:
        dlm = random_network(family, scale, seed)
        found = {probe.name: probe for probe in probes.run_probes(dlm, train=False)}  # train mode: equalities
        assert [name for name, probe in found.items() if probe.status == "fail"] == [], (seed, found)
        assert found["logit alignment"].status == "n/a"  # random weights know no text: no verdict either way
        assert found[two_way].status == "pass" and found["attention mask honoured"].status == "pass"
        backward, forward = map(float, re.findall(r"by (\S+) when", found[two_way].measured))
        ratios.append(backward / forward)
    # a false fail needs backward / forward < 1 / REFERENCE_FACTOR; conforming networks stay tenfold above that
    assert min(ratios) > 10 / probes.REFERENCE_FACTOR, ratios


@pytest.mark.parametrize("scale", [0.001, 3.0])
def test_at_extreme_weight_scales_the_probes_pass_or_say_n_a(scale: float) -> None:
    """Tiny weights (tokens barely affect one another: a fixed tolerance once called that causal) and large ones
    (saturated attention: one changed token may not show, so every later token changes at once)."""
    for family in ("llada", "dream", "sdar"):
        for seed in range(2):
            statuses = {p.name: p.status for p in probes.run_probes(random_network(family, scale, seed), train=False)}
            assert "fail" not in statuses.values(), (family, seed, statuses)


def random_logits(generator: torch.Generator, ids: list[int], masked: list[int], draws: int, tied: bool):
    """The logits [draws, L, V] random networks give the probe text with ``masked`` in place (a MASK where a target
    is): hidden states made of the visible token's embedding (the residual stream), a mix of every visible token
    (attention) and a position's own part, in random proportions per draw; an output head independent of them, or
    the embedding itself (tied)."""
    vocab, width = max(ids + masked) + 1, 16
    embedding = torch.randn(draws, vocab, width, generator=generator)
    head = embedding if tied else torch.randn(draws, vocab, width, generator=generator)
    seen = embedding[:, masked]  # [draws, L, width]
    residual, mixing, own = (
        torch.rand(3, draws, 1, 1, generator=generator) * torch.tensor([2.0, 2.0, 1.0])[:, None, None, None]
    )
    noise = torch.randn(draws, len(ids), width, generator=generator)
    hidden = residual * seen + mixing * seen.mean(1, keepdim=True) + own * noise
    return hidden @ head.transpose(1, 2)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_alignment_statistic_stays_within_its_binomial_bound_on_random_logits(tied: bool) -> None:
    """Over 10,000 random draws each, every reading's count of top-ranked targets has at most the mean and the
    upper tail of a Binomial(n, k / V) (allowing four standard errors), and the verdict is wrong (anything but n/a)
    at most at ALIGNMENT_ALPHA."""
    tokenizer = build_tiny(**SMALL).tokenizer
    ids = tokenizer(probes.PROBE_TEXT, add_special_tokens=False)["input_ids"][: probes.ALIGNMENT_LENGTH]
    targets = probes.alignment_targets(ids)
    masked = [tokenizer.mask_token_id if i in targets else token for i, token in enumerate(ids)]
    n, vocab = len(targets), max(ids + masked) + 1
    chance = max(1, round(probes.TOP_SHARE * vocab)) / vocab
    needed = probes.binomial_threshold(n, chance, probes.ALIGNMENT_ALPHA / 2)
    tail = sum(math.comb(n, c) * chance**c * (1 - chance) ** (n - c) for c in range(needed, n + 1))
    assert n >= 10 and needed <= n and tail <= probes.ALIGNMENT_ALPHA / 2  # enough distinct targets to decide
    generator, draws = torch.Generator().manual_seed(0), 10_000
    hits = {offset: [] for offset in (-1, 0, 1)}
    for _ in range(draws // 2_000):
        for offset, counts in probes.alignment_hits(
            random_logits(generator, ids, masked, 2_000, tied), ids, targets
        ).items():
            hits[offset] += counts.tolist()
    for offset, counts in hits.items():
        mean, reached = sum(counts) / draws, sum(count >= needed for count in counts) / draws
        assert mean <= n * chance + 4 * math.sqrt(n * chance * (1 - chance) / draws), (offset, mean)
        assert reached <= tail + 4 * math.sqrt(tail / draws), (offset, reached)
    verdicts = [probes.alignment_decision({o: hits[o][i] for o in hits}, needed) for i in range(draws)]
    wrong = sum(verdict != "n/a" for verdict in verdicts) / draws
    assert wrong <= probes.ALIGNMENT_ALPHA + 4 * math.sqrt(probes.ALIGNMENT_ALPHA / draws), wrong


class KnowsTheText:
    """A stand-in model that knows the probe text: its logits at position t rank the text's token at t + ``shift``
    first (``shift`` 1: the logits are read one position off, as a Dream checkpoint under the wrong backend)."""

    attention, block_size, device = "full", None, torch.device("cpu")

    def __init__(self, shift: int) -> None:
        self.tokenizer = build_tiny(**SMALL).tokenizer
        self.mask_id, self.shift = self.tokenizer.mask_token_id, shift

    def logits(self, ids: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
        text = probes.probe_ids(self, ids.shape[1] + 1)[0]
        logits = torch.zeros(1, ids.shape[1], len(self.tokenizer))
        logits[0, torch.arange(ids.shape[1]), text[self.shift : self.shift + ids.shape[1]]] = 10.0
        return logits


def test_a_model_that_knows_the_text_passes_and_one_read_one_off_fails_naming_the_numbers(monkeypatch) -> None:
    aligned, shifted = probes.logit_alignment(KnowsTheText(0)), probes.logit_alignment(KnowsTheText(1))
    assert aligned.status == "pass" and shifted.status == "fail"
    n = len(probes.alignment_targets(probes.probe_ids(KnowsTheText(0), probes.ALIGNMENT_LENGTH)[0].tolist()))
    assert aligned.measured.startswith(f"{n}/{n} masked tokens in their position's top 1 of ")
    assert re.match(rf"0/{n} masked tokens .*, {n} / 0 one off; 3 needed .*false verdict <= 0.001\)", shifted.measured)
    monkeypatch.setattr(probes, "logit_alignment", lambda model: shifted)
    with pytest.raises(UserError, match=rf"logit alignment: 0/{n} masked tokens .* 3 needed"):
        probes.require_conventions(random_network("llada", 0.02, 0), "shifted")
