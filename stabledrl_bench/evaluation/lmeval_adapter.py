"""lm-eval adapter: any :class:`DiffusionLM` as an ``lm_eval`` model, decoding with this harness's samplers.

Registered as ``stabledrl_dllm``. From Python, pass an instance to ``lm_eval.simple_evaluate(model=...)``;
from the command line::

    lm_eval --model stabledrl_dllm --model_args pretrained=/path/to/ckpt,protocol=d1,max_completion_length=256 \\
        --include_path tasks/ --tasks dllm_gsm8k --limit 8

(the project's task YAMLs import this module, which registers the model, before lm-eval builds it).

Like every public dLLM wrapper, ``generate_until`` decodes a fixed canvas (``max_completion_length``; lm-eval's
``max_gen_toks`` is ignored and logged once) and applies ``until`` stop strings after decoding. The task YAMLs
emit the *user message*; the adapter applies the protocol's chat template and prefill itself, exactly as the d1
evaluator does. A sampled protocol (``protocol=d1-n16-t1``) decodes at its temperature and goes with the
``dllm_<task>_pass16`` tasks, which repeat every request 16 times and report pass@k and maj@k.
``loglikelihood`` is a Monte-Carlo ELBO (stratified mask counts with the antithetic complement,
the ESPO/LLaDA estimator; for block-diffusion models the staircase ELBO summed over blocks), a lower bound
on log p(continuation | context).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from stabledrl_bench.core.estimators import SequenceBatch, build_estimator
from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.core.models.backends import load_model_spec
from stabledrl_bench.core.sampling import generate
from stabledrl_bench.errors import INT64_LIMIT, UserError
from stabledrl_bench.evaluation.protocols import get_protocol

log = logging.getLogger(__name__)


DTYPES = ("float32", "bfloat16", "float16")


def _int_arg(name: str, value: Any, *, minimum: int) -> int:
    """A model argument that must be an integer >= ``minimum`` (given as text or a number); one line naming it."""
    text = str(value).strip()
    if isinstance(value, bool) or not (text.lstrip("-").isdigit() and minimum <= int(text) < INT64_LIMIT):
        raise UserError(f"stabledrl_dllm: {name}={value!r} must be an integer >= {minimum}")
    return int(text)


@register_model("stabledrl_dllm")
class DiffusionEvalLM(LM):
    """lm-eval model over a diffusion LM; every decode setting comes from a named protocol."""

    def __init__(
        self,
        pretrained: str | DiffusionLM = "tiny",
        protocol: str = "d1",
        max_completion_length: int = 256,
        batch_size: int | str | None = 8,
        mc_num: int = 16,
        seed: int = 0,
        device: str | None = None,
        dtype: str | None = None,
        max_batch_size: int | None = None,
        trust_remote_code: bool | str = False,
        **unused: Any,
    ) -> None:
        super().__init__()
        if unused:
            raise UserError(f"stabledrl_dllm: unknown model_args {', '.join(sorted(unused))}")
        # lm-eval passes --model_args as text: every value is checked here, before the model loads
        max_completion_length = _int_arg("max_completion_length", max_completion_length, minimum=1)
        mc_num = _int_arg("mc_num", mc_num, minimum=2)
        seed = _int_arg("seed", seed, minimum=0)
        batch_size = 8 if batch_size in (None, "auto") else _int_arg("batch_size", batch_size, minimum=1)
        if max_batch_size is not None:
            _int_arg("max_batch_size", max_batch_size, minimum=1)
        if dtype is not None and str(dtype) not in DTYPES:
            raise UserError(f"stabledrl_dllm: dtype={dtype!r} is not one of {', '.join(DTYPES)}")
        get_protocol(protocol)  # an unknown protocol is one line before loading
        trust = str(trust_remote_code).lower() in ("1", "true", "yes")
        if isinstance(pretrained, DiffusionLM):
            dlm = pretrained
        else:
            dlm = load_model_spec(str(pretrained), seed=int(seed), trust_remote_code=trust)
        if dtype:
            dlm.model.to(getattr(torch, str(dtype)))
        if device and str(device).startswith("cuda") and not torch.cuda.is_available():
            log.warning("stabledrl_dllm: device %s requested but CUDA is not available; using the CPU", device)
            device = "cpu"
        if device:
            dlm.model.to(device)
        self.dlm = dlm
        self.dlm.model.eval()
        self.protocol = get_protocol(protocol)
        self.settings = self.protocol.settings(max_completion_length, dlm)
        self.batch_size = batch_size
        self.mc_num = mc_num
        if self.mc_num % 2:
            raise UserError("stabledrl_dllm: mc_num must be an even number >= 2 (samples are stratified pairs)")
        self.seed = seed
        self._warned_max_gen = False
        self.nfe_total = 0

    # ------------------------------------------------------------------ lm-eval hooks
    @property
    def tokenizer_name(self) -> str:
        return str(self.dlm.name).replace("/", "__")

    def get_model_info(self) -> dict[str, Any]:
        return {
            "model": self.dlm.config_summary(),
            "protocol": self.protocol.to_dict(),
            "decode": self.settings.to_dict(),
            "nfe_total": self.nfe_total,
        }

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Decode every request's context on the protocol's fixed canvas; cut at EOS and ``until`` strings."""
        self._check_repeats(requests)
        generator = torch.Generator().manual_seed(self.seed)
        contexts = [req.args[0] for req in requests]
        stops = [_until(req.args[1]) for req in requests]
        self._note_max_gen(requests)
        outputs: list[str | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: len(contexts[i]))
        bar = tqdm(total=len(requests), desc="stabledrl_dllm generate", disable=disable_tqdm)
        with torch.no_grad():
            for lo in range(0, len(order), self.batch_size):
                idx = order[lo : lo + self.batch_size]
                ids, mask = self.dlm.encode_prompts(
                    [contexts[i] for i in idx],
                    chat_template=self.protocol.chat_template,
                    prefill=self.protocol.prefill,
                )
                out = generate(self.dlm, ids, mask, self.settings, generator=generator)
                self.nfe_total += out.nfe * len(idx)
                for i, text in zip(idx, self.dlm.decode(out.completion_ids), strict=True):
                    outputs[i] = _cut(text, stops[i])
                bar.update(len(idx))
        bar.close()
        return [o if o is not None else "" for o in outputs]

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Monte-Carlo ELBO of each continuation given its raw context (no chat template).

        Full attention: ``mc_num`` masked copies of the request form one batch; the estimator stratifies their
        mask counts across the batch and adds each copy's complement, so the average is a low-variance lower
        bound. Block diffusion: the staircase ELBO (log-likelihood scale, every block conditioned on the clean
        blocks before it) averaged over ``mc_num`` copies.
        ``is_greedy``: the one-step prediction with the whole continuation masked equals the continuation
        (under the model's own attention pattern).
        """
        if self.dlm.attention == "block":
            estimator = build_estimator("staircase_elbo", num_mc=1, scale="sum").bind(self.dlm)
        else:
            estimator = build_estimator("espo_elbo", num_mc=1, reduce_var=True)
        generator = torch.Generator().manual_seed(self.seed)
        results = []
        device = self.dlm.device
        with torch.no_grad():
            for req in tqdm(requests, desc="stabledrl_dllm loglikelihood", disable=disable_tqdm):
                context, continuation = req.args
                ctx = self.dlm.tokenizer(context, add_special_tokens=False)["input_ids"]
                cont = self.dlm.tokenizer(continuation, add_special_tokens=False)["input_ids"]
                if not cont:
                    results.append((0.0, True))
                    continue
                n = self.mc_num // 2 if self.dlm.attention == "full" else self.mc_num
                batch = SequenceBatch(
                    prompt_ids=torch.tensor([ctx or [self.dlm.eos_id]] * n, device=device),
                    prompt_mask=torch.ones(n, max(1, len(ctx)), dtype=torch.bool, device=device),
                    completion_ids=torch.tensor([cont] * n, device=device),
                    completion_mask=torch.ones(n, len(cont), dtype=torch.bool, device=device),
                )
                elbo = estimator.evaluate(self.dlm, batch, estimator.draw(batch, generator)).elbo
                masked = torch.cat(
                    (batch.prompt_ids[:1], torch.full((1, len(cont)), self.dlm.mask_id, device=device)), dim=1
                )
                attention = self.dlm.context_attention(batch.prompt_mask[:1], len(cont))
                greedy = self.dlm.logits(masked, attention)[0, -len(cont) :].argmax(-1)
                results.append((float(elbo.mean()), bool((greedy == batch.completion_ids[0]).all())))
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError(
            "stabledrl_dllm: rolling log-likelihood (perplexity tasks) is not defined for masked diffusion LMs"
        )

    def _check_repeats(self, requests) -> None:
        """A sampled protocol (``<name>-n<N>-t<T>``) names its decodes per problem; the task's ``repeats`` must
        agree, or the results would carry a protocol name that misstates how they were decoded."""
        if not self.protocol.pass_at_k:
            return
        repeats = sorted({getattr(req, "repeats", 1) for req in requests})
        if repeats != [self.protocol.repeats]:
            raise UserError(
                f"stabledrl_dllm: protocol {self.protocol.name} decodes {self.protocol.repeats} times per problem, "
                f"but the task repeats its requests {', '.join(map(str, repeats))} times (name a protocol "
                f"<base>-n{repeats[-1]}-t<temperature> for this task)"
            )

    def _note_max_gen(self, requests) -> None:
        asked = {r.args[1].get("max_gen_toks") for r in requests if isinstance(r.args[1], dict)}
        asked.discard(None)
        if asked and not self._warned_max_gen:
            log.warning(
                "stabledrl_dllm decodes a fixed canvas of %d tokens (protocol %s); ignoring max_gen_toks=%s",
                self.settings.max_completion_length,
                self.protocol.name,
                sorted(asked),
            )
            self._warned_max_gen = True


def _until(gen_kwargs: Any) -> list[str]:
    until = (gen_kwargs or {}).get("until", []) if isinstance(gen_kwargs, dict) else []
    return [until] if isinstance(until, str) else [s for s in until if s]


def _cut(text: str, stops: list[str]) -> str:
    """Everything before the first occurrence of any stop string."""
    end = len(text)
    for stop in stops:
        pos = text.find(stop)
        if pos != -1:
            end = min(end, pos)
    return text[:end]
