"""The lm-eval adapter: Python and command-line paths, decoding parity with the native path, MC-ELBO values."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance

from stabledrl_bench.core.sampling import generate
from stabledrl_bench.evaluation.lmeval_adapter import DiffusionEvalLM, _cut
from stabledrl_bench.evaluation.protocols import PROTOCOLS
from stabledrl_bench.tasks import TASKS, get_task

REPO = Path(__file__).resolve().parents[1]
LMEVAL_TASKS = REPO / "tasks" / "lmeval"


@pytest.fixture
def model_dir(small_checkpoint: Path) -> Path:
    return small_checkpoint


def _request(kind: str, args: tuple, idx: int = 0) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=idx)


def test_generate_until_matches_native_decoding_and_cuts_stop_strings(model_dir):
    lm = DiffusionEvalLM(pretrained=str(model_dir), protocol="d1", max_completion_length=16, batch_size=2)
    contexts = ["What is 2+2?", "A much longer question, to force left padding in the batch?", "Hi"]
    out = lm.generate_until([_request("generate_until", (c, {"until": []}), i) for i, c in enumerate(contexts)])
    dlm = lm.dlm
    for context, text in zip(contexts, out, strict=True):
        ids, mask = dlm.encode_prompts([context], chat_template=True, prefill="<reasoning>")
        native = dlm.decode(generate(dlm, ids, mask, lm.settings).completion_ids)[0]
        assert text == native
    assert _cut("abc</answer>def", ["</answer>", "zzz"]) == "abc"
    assert _cut("abc", []) == "abc"


def test_single_token_loglikelihood_is_exact(model_dir):
    """For a one-token continuation the stratified ELBO with its complement pass is exactly log p(token)."""
    lm = DiffusionEvalLM(pretrained=str(model_dir), mc_num=4)
    dlm = lm.dlm
    ctx_ids = dlm.tokenizer("12+3=", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = dlm.logits(torch.tensor([[*ctx_ids, dlm.mask_id]]))[0, -1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    best = dlm.tokenizer.decode([int(logp.argmax())])
    other = "7" if best != "7" else "8"
    (ll_best, greedy_best), (ll_other, greedy_other) = lm.loglikelihood(
        [_request("loglikelihood", ("12+3=", best)), _request("loglikelihood", ("12+3=", other), 1)]
    )
    assert ll_best == pytest.approx(logp.max().item(), abs=1e-5)
    assert ll_other == pytest.approx(logp[dlm.tokenizer.convert_tokens_to_ids(other)].item(), abs=1e-5)
    assert greedy_best and not greedy_other


def test_loglikelihood_is_seeded_and_a_lower_bound_scale(model_dir):
    lm = DiffusionEvalLM(pretrained=str(model_dir), mc_num=8, seed=3)
    req = [_request("loglikelihood", ("Question: 2+2=", " 4 because two and two"))]
    a, b = lm.loglikelihood(req)[0][0], DiffusionEvalLM(pretrained=str(model_dir), mc_num=8, seed=3).loglikelihood(req)
    assert a == b[0][0]
    assert a < 0
    with pytest.raises(NotImplementedError):
        lm.loglikelihood_rolling([_request("loglikelihood_rolling", ("text",))])


def test_bad_model_args_are_clear(model_dir):
    from stabledrl_bench.errors import UserError

    with pytest.raises(UserError, match="unknown model_args"):
        DiffusionEvalLM(pretrained=str(model_dir), gen_lenght=16)
    with pytest.raises(UserError, match="unknown evaluation protocol"):
        DiffusionEvalLM(pretrained=str(model_dir), protocol="nope")
    with pytest.raises(UserError, match="block-diffusion models"):
        DiffusionEvalLM(pretrained=str(model_dir), protocol="tracerl-static")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"max_completion_length": "abc"}, "max_completion_length='abc' must be an integer >= 1"),
        ({"max_completion_length": "0"}, "max_completion_length='0' must be an integer >= 1"),
        ({"max_completion_length": -5}, "max_completion_length=-5 must be an integer >= 1"),
        ({"batch_size": "-3"}, "batch_size='-3' must be an integer >= 1"),
        ({"seed": "1.5"}, "seed='1.5' must be an integer >= 0"),
        ({"mc_num": "3"}, "mc_num must be an even number"),
        ({"mc_num": "0"}, "mc_num='0' must be an integer >= 2"),
        ({"dtype": "os"}, "dtype='os' is not one of float32, bfloat16, float16"),
        ({"dtype": "float64x"}, "dtype='float64x' is not one of"),
        ({"max_batch_size": "x"}, "max_batch_size='x' must be an integer >= 1"),
        ({"protocol": "nope"}, "unknown evaluation protocol"),
    ],
)
def test_every_model_arg_is_checked_with_one_line_naming_it(model_dir, args, message):
    """lm-eval hands ``--model_args`` over as text: bad values must not surface as ValueError or ZeroDivisionError
    deep in decoding, nor be coerced silently."""
    from stabledrl_bench.errors import UserError

    with pytest.raises(UserError) as info:
        DiffusionEvalLM(pretrained=str(model_dir), **args)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("protocol", [p for p in PROTOCOLS.values() if p.chat_template])
def test_protocol_prompt_settings_agree_with_the_tasks(protocol):
    """The adapter only sees the user message: its chat/prefill must be what the task's PromptSpec says."""
    for name in TASKS:
        task = get_task(name)
        if protocol.prompt_protocol not in task.protocols:  # HumanEval and MBPP have StableDRL's prompts only
            continue
        spec = task.prompt(task.eval_docs(limit=1)[0], protocol.prompt_protocol)
        assert (spec.chat_template, spec.prefill) == (protocol.chat_template, protocol.prefill), (name, protocol.name)


def test_simple_evaluate_with_a_model_instance(model_dir):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    lm = DiffusionEvalLM(pretrained=str(model_dir), protocol="d1", max_completion_length=16, batch_size=4)
    manager = TaskManager(include_path=str(LMEVAL_TASKS), include_defaults=False)
    results = simple_evaluate(
        model=lm, tasks=["dllm_countdown", "dllm_sudoku"], task_manager=manager, limit=3, bootstrap_iters=0
    )
    for task in ("dllm_countdown", "dllm_sudoku"):
        metrics = results["results"][task]
        assert 0.0 <= metrics["acc,none"] <= 1.0
    assert results["config"]["protocol"]["name"] == "d1"


@pytest.fixture(scope="module")
def block_checkpoint(tmp_path_factory) -> Path:
    from conftest import SMALL

    from stabledrl_bench.core.models import build_tiny, save_diffusion_lm

    path = tmp_path_factory.mktemp("small-tiny-block")
    save_diffusion_lm(build_tiny(attention="block", **SMALL), path)
    return path


def test_lm_eval_under_accelerate_launch_shares_the_work_and_scores_as_one_process(block_checkpoint, tmp_path):
    """lm-eval's command line (``tests/lmeval_cli.py``: the task YAMLs, given by path, import the adapter, which
    registers the model), under ``accelerate launch`` on 2 CPU processes (the DDP config, as
    tests/test_multiprocess.py launches it): each process decodes a share, one writes the output, and every decode
    equals the one-process run's. The protocol samples (tracerl-dynamic: temperature 1) and 3 documents split
    2 + 1, so the noise plan and lm-eval's padding of the shorter share are both exercised."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from multiprocess_scenarios import failure, launch

    model_args = {"pretrained": str(block_checkpoint), "protocol": "tracerl-dynamic", "max_completion_length": 8}
    args = ",".join(f"{key}={value}" for key, value in model_args.items())
    out = tmp_path / "out"
    cli = ["--model", "stabledrl_dllm", "--model_args", args, "--include_path", "tasks", "--tasks"]
    cli += ["tasks/lmeval/dllm_sudoku.yaml", "--limit", "3", "--batch_size", "2", "--device", "cpu"]
    proc = launch(
        "ddp", str(REPO / "tests" / "lmeval_cli.py"), *cli, "--output_path", str(out), "--log_samples", fresh=out
    )
    assert proc.returncode == 0, failure(proc.stderr)
    shares = re.findall(r"stabledrl_dllm: process (\d) of 2 decodes (\d) of the 3 requests", proc.stderr)
    assert sorted(shares) == [("0", "2"), ("1", "1")]
    (results,) = out.rglob("results_*.json")  # written once
    (samples,) = out.rglob("samples_dllm_sudoku_*.jsonl")
    two = {row["doc_id"]: row["filtered_resps"] for row in map(json.loads, samples.read_text().splitlines())}

    manager = TaskManager(include_path=str(LMEVAL_TASKS), include_defaults=False, metadata=model_args)
    one = simple_evaluate(
        model="stabledrl_dllm", model_args=args, tasks=["dllm_sudoku"], task_manager=manager, limit=3, batch_size=2
    )
    assert two == {row["doc_id"]: row["filtered_resps"] for row in one["samples"]["dllm_sudoku"]}
    assert json.loads(results.read_text())["results"] == json.loads(json.dumps(one["results"]))
