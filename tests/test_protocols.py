"""Evaluation protocols: the approximate (Fast-dLLM) ones are opt-in, named, and decode what they say."""

from __future__ import annotations

import dataclasses

import pytest

from stabledrl_bench.cli import build_parser
from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.core.sampling import FullDecode
from stabledrl_bench.evaluation.protocols import PROTOCOLS, get_protocol

FAST = ("d1-fast", "d1-fast-prefix", "d1-parallel", "tiny-fast", "tiny-parallel")


def test_exact_protocols_decode_exactly_and_fast_ones_are_marked() -> None:
    assert {name for name, protocol in PROTOCOLS.items() if protocol.approximate} == set(FAST)
    for name in FAST:
        assert get_protocol(name).description.startswith("APPROXIMATE")
    full = build_tiny()
    for name, protocol in PROTOCOLS.items():
        if protocol.attention == "full":
            assert protocol.settings(64, full).approximate == (name in FAST)


@pytest.mark.parametrize(
    ("name", "base", "cache"),
    [
        ("d1-fast", "d1", "dual"),
        ("tiny-fast", "tiny", "dual"),
        ("d1-fast-prefix", "d1", "prefix"),
        ("tiny-parallel", "tiny", "none"),
    ],
)
def test_fast_protocols_keep_their_base_prompt_and_lengths(name: str, base: str, cache: str) -> None:
    fast, exact = get_protocol(name), get_protocol(base)
    differing = {f.name for f in dataclasses.fields(fast) if getattr(fast, f.name) != getattr(exact, f.name)}
    assert differing == {"name", "description", "cache", "strategy", "stop_at_eos"} - (
        {"cache"} if cache == "none" else set()
    )
    settings = fast.settings(256, build_tiny())
    assert settings == dataclasses.replace(
        exact.settings(256, build_tiny()), cache=cache, strategy="dynamic", threshold=0.9, stop_at_eos=True
    )


def test_approximate_decoding_is_never_the_default() -> None:
    assert build_parser().parse_args(["eval", "--model", "tiny", "--task", "gsm8k"]).protocol == "d1"
    assert not FullDecode().approximate


def test_eval_command_records_table2_columns_from_the_protocol(tmp_path) -> None:
    """Table 2's static/dynamic column is the protocol's (EvalProtocol.sampling), for `eval` as for `reproduce`."""
    import json

    from stabledrl_bench.cli import main

    for protocol in ("tiny-static", "tiny-dynamic"):
        argv = ["eval", "--model", "tiny-block", "--task", "sudoku", "--table", "table2", "--protocol", protocol]
        argv += ["--length", "2000", "--max-completion-length", "8", "--limit", "2", "--results", str(tmp_path)]
        assert main(argv) == 0
    records = [json.loads(path.read_text()) for path in sorted(tmp_path.rglob("*.json"))]
    assert sorted((r["protocol"], r["sampling"]) for r in records) == [
        ("tiny-dynamic", "dynamic"),
        ("tiny-static", "static"),
    ]
    assert get_protocol("d1").sampling is None and get_protocol("tiny-dynamic-n4-t1").sampling == "dynamic"
