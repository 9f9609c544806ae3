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

**Which prompts.** The protocol names the prompts too (d1's for ``d1``, TraceRL's for ``tracerl-*``, ...). lm-eval
passes ``--model_args`` on to the tasks as metadata, so the shipped tasks render the same protocol's user message
(``tasks/lmeval/utils.py`` stamps it on every doc); a request whose doc says otherwise is refused in one line.
From Python, give the tasks the protocol: ``TaskManager(include_path=..., metadata={"protocol": ...})``.

**Data parallel.** Under ``accelerate launch ... -m lm_eval`` (N processes) lm-eval hands each process every N-th
document; the adapter reports its rank and world size and gathers as lm-eval's own HF model does, and only the main
process writes the results. The processes then plan the same batches the one-process run would make (all requests,
sorted by prompt length, each batch's noise keyed by the seed and the batch's index), each decodes every N-th
batch, and they exchange the texts: every score equals one process's, sampled protocols included. Each
log-likelihood draws its masks from a generator keyed by the request itself.

**Refusals are one line.** A :class:`UserError` the adapter or the task glue raises under lm-eval's command line
(which prints tracebacks) ends the process with its ``error: ...`` line (:func:`one_line_user_errors`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from stabledrl_bench.core.estimators import SequenceBatch, build_estimator
from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.core.models.backends import load_model_spec
from stabledrl_bench.core.sampling import generate
from stabledrl_bench.errors import INT64_LIMIT, UserError
from stabledrl_bench.evaluation.lmeval_output import fail_on_storage_errors
from stabledrl_bench.evaluation.protocols import get_protocol
from stabledrl_bench.processes import keyed_generator, launched, process_state

# in lm-eval's logger tree: its command line shows these lines with its own (INFO and up)
log = logging.getLogger("lm_eval.models.stabledrl_dllm")
fail_on_storage_errors()  # lm-eval's output files: a full or read-only --output_path is one error line (module doc)


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
        if launched():  # accelerate launch: this process's share of the documents (lm-eval splits them by rank)
            state = process_state()
            self._rank, self._world_size = state.process_index, state.num_processes
            if torch.cuda.is_available() and (device is None or str(device).startswith("cuda")):
                device = str(state.device)  # each process on its own GPU, as lm-eval's HF model does
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
        self._device = dlm.device
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
        """Decode every request's context on the protocol's fixed canvas; cut at EOS and ``until`` strings.

        The batches are planned over every process's requests (one process: its own), so that each request is
        decoded in the same batch, with the same noise, however many processes share the work (module docstring).
        """
        self._check_repeats(requests)
        self._check_prompts(requests)
        self._note_max_gen(requests)
        local = _work_items(requests, self.rank)
        items = sorted(item for share in self._everyone(local) for item in share if item.key == item.decoded)
        order = sorted(range(len(items)), key=lambda i: (len(items[i].context), i))
        batches = [order[lo : lo + self.batch_size] for lo in range(0, len(order), self.batch_size)]
        mine = range(self.rank, len(batches), self.world_size)
        if self.world_size > 1:
            log.info(
                "stabledrl_dllm: process %d of %d decodes %d of the %d requests",
                self.rank,
                self.world_size,
                sum(len(batches[b]) for b in mine),
                len(items),
            )
        texts: dict[tuple, str] = {}
        bar = tqdm(total=sum(len(batches[b]) for b in mine), desc="stabledrl_dllm generate", disable=disable_tqdm)
        with torch.no_grad():
            for b in mine:
                batch = [items[i] for i in batches[b]]
                ids, mask = self.dlm.encode_prompts(
                    [item.context for item in batch],
                    chat_template=self.protocol.chat_template,
                    prefill=self.protocol.prefill,
                )
                out = generate(self.dlm, ids, mask, self.settings, generator=self._generator("generate", b))
                self.nfe_total += out.nfe * len(batch)
                for item, text in zip(batch, self.dlm.decode(out.completion_ids), strict=True):
                    texts[item.key] = _cut(text, item.stops)
                bar.update(len(batch))
        bar.close()
        if self.world_size > 1:
            for share in self._everyone(texts):
                texts.update(share)
        return [texts[item.decoded] for item in local]

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
        results = []
        device = self.dlm.device
        with torch.no_grad():
            for req in tqdm(requests, desc="stabledrl_dllm loglikelihood", disable=disable_tqdm):
                context, continuation = req.args
                # masks keyed by the request: the same estimate on whichever process, in whichever order
                generator = keyed_generator(self.seed, "loglikelihood", context, continuation)
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

    # ------------------------------------------------------------------ data parallel (lm-eval's contract)
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every process's ``tensor``, concatenated in rank order (0-d tensors: stacked)."""
        if self.world_size == 1:
            return tensor
        parts = [torch.zeros_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every process's ``obj`` on process ``dst`` (None elsewhere)."""
        everyone = self._everyone(obj)
        return everyone if self.rank == dst else None

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def _everyone(self, obj: Any) -> list[Any]:
        """``[obj of rank 0, obj of rank 1, ...]`` on every process (``[obj]`` alone)."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def _generator(self, *key: object) -> torch.Generator:
        """A stream keyed by the seed and ``key``, on the model's device (where the sampler draws its noise)."""
        device = self.dlm.device
        return torch.Generator(device=device).manual_seed(keyed_generator(self.seed, *key).initial_seed())

    # ------------------------------------------------------------------ checks
    def _check_prompts(self, requests) -> None:
        """The shipped tasks stamp each doc with the protocol whose prompts they rendered; another protocol's
        prompts under this protocol's decoding would be a result under neither."""
        for req in requests:
            doc = getattr(req, "doc", None)
            rendered = doc.get("prompt_protocol") if isinstance(doc, dict) else None
            if rendered is not None and rendered != self.protocol.prompt_protocol:
                raise UserError(
                    f"stabledrl_dllm: protocol {self.protocol.name} decodes {self.protocol.prompt_protocol!r} "
                    f"prompts, but task {getattr(req, 'task_name', '?')} rendered {rendered!r} prompts (protocol "
                    f"{doc.get('protocol')}); give the tasks the same protocol (lm_eval passes --model_args on; "
                    f"from Python: TaskManager(..., metadata={{'protocol': '{self.protocol.name}'}}))"
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


@dataclass(frozen=True, order=True)
class _WorkItem:
    """One decode of a request: ``key`` names it the same on every process (task, document, request index and
    repeat; the position in this process's list only for requests that carry no document), ``decoded`` is the
    decode whose text it returns (itself, or for lm-eval's padding copies a real repeat of the same request)."""

    key: tuple
    decoded: tuple
    context: str
    stops: tuple[str, ...]


def _work_items(requests: Sequence[Any], rank: int) -> list[_WorkItem]:
    """The requests of one ``generate_until`` call as work items, in their order.

    lm-eval repeats a request ``repeats`` times in the list (the sampled tasks), and under data parallel pads the
    shorter shards with further copies of their last request: a padding copy returns a real repeat's text.
    """
    seen: dict[tuple, int] = {}
    items = []
    for position, req in enumerate(requests):
        doc_id = getattr(req, "doc_id", None)
        if doc_id is None:  # a request built by hand: named by where it is
            name: tuple = ("", rank, position)
        else:
            name = (str(getattr(req, "task_name", "")), int(doc_id), int(getattr(req, "idx", 0)))
        repeat = seen.get(name, 0)
        seen[name] = repeat + 1
        repeats = getattr(req, "repeats", None) or 1
        key = (*name, repeat)
        items.append(_WorkItem(key, (*name, repeat % repeats), req.args[0], tuple(_until(req.args[1]))))
    return items


def one_line_user_errors() -> None:
    """End the process with one ``error: ...`` line when a :class:`UserError` goes uncaught.

    lm-eval's command line prints a traceback for whatever escapes it; for a problem the user can fix (a model
    argument, a protocol that does not fit the model or the task) that is the one line the harness's own command
    line prints. Installed once, on import of this module (which the task YAMLs import too); other exceptions keep
    their tracebacks.
    """
    previous = sys.excepthook
    if getattr(previous, "stabledrl_one_line", False):
        return

    def hook(kind, value, traceback) -> None:
        if issubclass(kind, UserError):
            print(f"error: {value}", file=sys.stderr)
        else:
            previous(kind, value, traceback)

    hook.stabledrl_one_line = True  # type: ignore[attr-defined]
    sys.excepthook = hook


one_line_user_errors()


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
