"""The published tokenizers end to end: tiny random-weight native LLaDA, Dream and SDAR folders carrying their real
tokenizer files (``tests/real_tokenizers.py``; Dream's and SDAR's with the real Qwen byte-level BPE vocabulary,
LLaDA's with its real special tokens, ids and chat template over a stand-in vocabulary).

Checked for each family: the folder loads without ``--trust-remote-code`` and runs none of its files; the mask,
EOS, pad and end-of-turn ids are the published ones; every protocol renders the prompt exactly as the method's
official evaluation code renders it for the same question (the strings, written out here from those files, and the
token ids the official code gets by tokenizing its string); decoding stops at the real end tokens, in the native
decoder and through lm-eval; an RL step and an SFT step run; and lm-eval evaluates the block-diffusion model
through the shipped tasks under TraceRL's protocols.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from backend_checks import rl_step
from lm_eval.api.instance import Instance
from real_tokenizers import FAMILIES, write_checkpoint

from stabledrl_bench.core.models import DiffusionLM, load_diffusion_lm
from stabledrl_bench.core.sampling import generate
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.lmeval_adapter import DiffusionEvalLM
from stabledrl_bench.evaluation.protocols import get_protocol
from stabledrl_bench.tasks import get_task
from stabledrl_bench.tasks.base import RewardResult
from stabledrl_bench.tasks.math_common import D1_GSM8K_SYSTEM_PROMPT, D1_MATH_SYSTEM_PROMPT
from stabledrl_bench.training.runlog import read_log
from stabledrl_bench.training.sft import SFTConfig, run_sft

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("real-tokenizers")
    return {family: write_checkpoint(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="module")
def models(folders) -> dict[str, DiffusionLM]:
    return {family: load_diffusion_lm(folder, trust_remote_code=False) for family, folder in folders.items()}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_published_folders_load_natively_with_their_published_ids(folders, models, family) -> None:
    spec, dlm, folder = FAMILIES[family], models[family], folders[family]
    assert not (folder / "RAN").exists()  # the tokenizer file the config names never ran
    expected = "TokenizersBackend" if family == "llada" else "Qwen2Tokenizer"  # transformers' own classes
    assert type(dlm.tokenizer).__name__ == expected and dlm.family == f"{family}-native"
    assert (dlm.mask_id, dlm.eos_id, dlm.pad_id) == (spec.mask, spec.eos, spec.pad)
    assert set(dlm.stop_ids) == {spec.eos, spec.end_of_turn}
    names = {"llada": "<|mdm_mask|>", "dream": "<|mask|>", "sdar": "<|MASK|>"}
    assert dlm.tokenizer.convert_ids_to_tokens(dlm.mask_id) == names[family]
    if spec.code:  # the published modeling code is refused without the opt-in; the tokenizer file is not named
        with pytest.raises(UserError, match="ships its own Python code") as refused:
            load_diffusion_lm(folder, implementation="remote", trust_remote_code=False)
        assert spec.code not in str(refused.value)


# What each method's official evaluation code feeds the model for one question, written out from its files:
# d1 eval/gsm8k.py / math500.py (create_prompt: the chat template of SYSTEM_PROMPT + "\n\n" + question, then
# "<reasoning>"), rendered with LLaDA-8B-Instruct's and Dream-v0-Instruct-7B's templates; StableDRL math_metrics.py
# (collate_fn_math: problem + instruction; collate_fn_gsm8k: the question; no template); dLLM-RL
# sample/trado_sample.py (its literal "cot prompt").
def llada_turn(content: str) -> str:
    return (
        "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n"
        + content.strip()  # the template's `| trim`
        + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def dream_turn(content: str) -> str:
    system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"  # Dream's template adds it
    return system + f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


def official_prompt(family: str, protocol: str, task: str, question: str) -> str:
    if protocol == "stabledrl-code":
        instruction = r"(Please put the final answer in \boxed{} tag, i.e. $\boxed{answer here}$)"
        return question if task == "gsm8k" else question + instruction
    if protocol.startswith("tracerl"):
        cot = "\nPlease reason step by step, and put your final answer within \\boxed{}."
        return f"<|im_start|>user\n{question}{cot}<|im_end|>\n<|im_start|>assistant\n"
    system = D1_GSM8K_SYSTEM_PROMPT if task == "gsm8k" else D1_MATH_SYSTEM_PROMPT
    turn = llada_turn if family == "llada" else dream_turn
    return turn(system + "\n\n" + question) + "<reasoning>"


PROMPT_CASES = [
    ("llada", "d1"),
    ("llada", "d1-fast"),  # the fast and sampled protocols keep their base protocol's prompts
    ("llada", "d1-n4-t1"),
    ("llada", "stabledrl-evalpy"),
    ("llada", "stabledrl-code"),
    ("dream", "d1"),
    ("sdar", "tracerl-static"),
    ("sdar", "tracerl-dynamic"),
]


@pytest.mark.parametrize(("family", "protocol"), PROMPT_CASES)
def test_every_protocol_renders_the_official_prompt_and_its_token_ids(models, family, protocol) -> None:
    dlm, proto = models[family], get_protocol(protocol)
    for name in ("gsm8k", "math500"):
        task = get_task(name)
        doc = task.eval_docs(limit=1)[0]
        spec = task.prompt(doc, proto.prompt_protocol)
        ours = dlm.render_prompt(spec.messages, chat_template=proto.chat_template, prefill=spec.prefill)
        theirs = official_prompt(family, protocol, name, task.question(doc))
        assert ours == theirs, (name, protocol)
        ids, _ = dlm.encode_prompts([spec.messages], chat_template=proto.chat_template, prefill=spec.prefill)
        assert ids[0].tolist() == dlm.tokenizer(theirs)["input_ids"]  # the official scripts tokenize their string
    # the published ids of the turn markers: <|startoftext|><|start_header_id|>, <|im_start|> "system" / "user" "\n"
    head = {"llada": [126080, 126346], "dream": [151644, 8948, 198], "sdar": [151644, 872, 198]}[family]
    if proto.chat_template:
        assert ids[0, : len(head)].tolist() == head
    if family == "sdar":  # <|im_end|> "\n" <|im_start|> "assistant" "\n", and no prefill
        assert ids[0, -5:].tolist() == [151645, 198, 151644, 77091, 198]


ANSWER = "x=42"


def scripted(dlm: DiffusionLM, prompt_len: int, end: int) -> None:
    """Make ``dlm`` greedily write ``ANSWER`` then ``end`` after a prompt of ``prompt_len`` tokens (one row), and
    ``end`` from there on: each completion position's scripted token gets the logit 1e4."""
    script = torch.tensor(dlm.tokenizer(ANSWER, add_special_tokens=False)["input_ids"] + [end])
    forward = type(dlm.model).forward
    offset = 1 if dlm.shift_logits else 0  # Dream's logits at position i are read for token i + 1

    def biased(model, input_ids, *args, position_ids=None, logits_to_keep=None, **kwargs):
        out = forward(model, input_ids, *args, position_ids=position_ids, logits_to_keep=logits_to_keep, **kwargs)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        if logits_to_keep is not None:  # the logits of those positions only (a decoding step reads one block)
            position_ids = position_ids[:, logits_to_keep]
        rows, cols = torch.nonzero(position_ids + offset >= prompt_len, as_tuple=True)
        at = (position_ids[rows, cols] + offset - prompt_len).clamp(max=len(script) - 1)
        out.logits[rows, cols, script[at]] = 1e4
        return out

    dlm.model.forward = biased.__get__(dlm.model)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_decoding_stops_at_the_published_end_tokens_natively_and_through_lm_eval(models, family) -> None:
    spec, dlm = FAMILIES[family], models[family]
    proto = get_protocol("tracerl-static" if family == "sdar" else "d1")
    canvas = 16 if family == "sdar" else 8  # SDAR: 4 blocks of 4; the others: one block, 4 steps of 2 tokens
    ids, mask = dlm.encode_prompts(["What is 6*7?"], chat_template=True, prefill=proto.prefill)
    answer = len(dlm.tokenizer(ANSWER)["input_ids"])
    assert answer == {"llada": 4, "dream": 4, "sdar": 4}[family]  # "x" "=" "4" "2": multi-token, digit by digit
    try:
        for end in (spec.end_of_turn, spec.eos):
            scripted(dlm, ids.shape[1], end)
            out = generate(dlm, ids, mask, proto.settings(canvas, dlm))
            assert dlm.decode(out.completion_ids) == [ANSWER]
            assert dlm.response_lengths(out.completion_ids).tolist() == [answer]
            if family == "sdar":  # block decoding stops after the 2nd block, which holds the end token
                assert out.nfe == 2 * (dlm.block_size + 1)  # 4 steps and the cache store per block
        lm = DiffusionEvalLM(pretrained=dlm, protocol=proto.name, max_completion_length=canvas)
        request = Instance("generate_until", {}, ("What is 6*7?", {"until": ["2"]}), 0)
        assert lm.generate_until([request], disable_tqdm=True) == ["x=4"]  # cut at the end token and at "2"
    finally:
        del dlm.model.forward


def varied(text: str, doc: dict) -> RewardResult:
    """A reward that differs between random completions from a 150k-token vocabulary (digits are rare there)."""
    del doc
    return RewardResult(float(sum(map(ord, text)) % 7), {})


@pytest.mark.parametrize(("family", "baseline"), [("llada", "stabledrl"), ("sdar", "trado")])
def test_an_rl_step_runs_on_the_real_tokenizers(folders, tmp_path, family, baseline) -> None:
    """The tasks' tiny prompts in the family's chat template; Dream's full-attention path is LLaDA's."""
    record = rl_step(folders[family], baseline, tmp_path, reward=varied)
    assert math.isfinite(record["loss"]) and 0 < record["grad_norm"] < math.inf


def test_an_sft_step_runs_on_a_real_tokenizer_and_the_policy_keeps_it(folders, tmp_path) -> None:
    cfg = SFTConfig(
        task="sudoku",
        model=str(folders["dream"]),
        protocol="tiny",
        train_split="train",
        max_steps=1,
        batch_size=2,
        max_completion_length=8,
        max_prompt_length=48,
        output_dir=str(tmp_path),
        save_every=0,
        progress=False,
    )
    final = run_sft(cfg)
    loss = read_log(tmp_path / "log.jsonl")[-1]["loss"]
    assert math.isfinite(loss) and loss > 0
    saved, published = load_diffusion_lm(final), load_diffusion_lm(folders["dream"])
    text = "<|im_start|>user 12+3=?<|im_end|><|mask|><|endoftext|>"
    assert saved.tokenizer(text)["input_ids"] == published.tokenizer(text)["input_ids"]
    assert (saved.mask_id, saved.eos_id, saved.stop_ids) == (published.mask_id, published.eos_id, published.stop_ids)


def test_lm_eval_runs_a_block_diffusion_model_through_the_shipped_tasks_under_tracerl(models) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    include = str(REPO / "tasks" / "lmeval")
    lm = DiffusionEvalLM(pretrained=models["sdar"], protocol="tracerl-static", max_completion_length=8)
    manager = TaskManager(include_path=include, include_defaults=False, metadata={"protocol": "tracerl-static"})
    results = simple_evaluate(model=lm, tasks=["dllm_math500"], task_manager=manager, limit=2, bootstrap_iters=0)
    assert 0.0 <= results["results"]["dllm_math500"]["acc,none"] <= 1.0
    for sample in results["samples"]["dllm_math500"]:
        doc, context = sample["doc"], sample["arguments"][0][0]
        assert (doc["protocol"], doc["prompt_protocol"]) == ("tracerl-static", "tracerl")
        rendered = lm.dlm.render_prompt(context, chat_template=True, prefill=lm.protocol.prefill)
        assert rendered == official_prompt("sdar", "tracerl-static", "math500", doc["problem"])
    # tasks left at their d1 prompts under a TraceRL adapter: refused in one line naming the fix
    plain = TaskManager(include_path=include, include_defaults=False)
    with pytest.raises(UserError, match=r"rendered 'd1' prompts.*metadata=\{'protocol': 'tracerl-static'\}") as info:
        simple_evaluate(model=lm, tasks=["dllm_math500"], task_manager=plain, limit=1, bootstrap_iters=0)
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match="protocol 'd1' is for full-attention models"):
        DiffusionEvalLM(pretrained=models["sdar"], protocol="d1")
    for length in (128, 256, 512):  # Table 2's lengths: the model's block of 4, one token per step
        for protocol in ("tracerl-static", "tracerl-dynamic"):
            lm = DiffusionEvalLM(pretrained=models["sdar"], protocol=protocol, max_completion_length=length)
            settings = lm.settings
            assert (settings.max_completion_length, settings.block_length, settings.steps) == (length, 4, length)


def test_an_uncaught_refusal_is_one_line_under_the_lm_eval_command_line(capsys) -> None:
    """lm-eval's CLI prints tracebacks for what escapes it; with the adapter imported (the task YAMLs import it),
    an uncaught UserError prints its one line instead, and other exceptions keep their tracebacks."""
    sys.excepthook(UserError, UserError("stabledrl_dllm: protocol d1 does not fit"), None)
    assert capsys.readouterr().err == "error: stabledrl_dllm: protocol d1 does not fit\n"
    try:
        raise ValueError("a bug")
    except ValueError as exc:
        sys.excepthook(ValueError, exc, exc.__traceback__)
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith("ValueError: a bug\n")
