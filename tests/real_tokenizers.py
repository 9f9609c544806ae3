"""Tiny random-weight LLaDA, Dream and SDAR folders that carry their published tokenizers (real special tokens and
ids, chat templates, and for Dream and SDAR the real byte-level BPE vocabulary), for the end-to-end tests in
``tests/test_real_tokenizers.py``. Where each fixture file comes from: ``tests/fixtures/tokenizers/README.md``.

Each folder is what a published checkpoint folder looks like to the loader: the family's ``config.json`` (its
``auto_map`` naming modeling files the folder does not have), native weights of the family's published vocabulary
size, and the tokenizer files. Dream's and SDAR's tokenizer configs also name a Python file (an ``auto_map``); the
folder holds a canary under that name which records that it ran, and it must never run.

LLaDA-8B-Instruct's own ``tokenizer.json`` could not be fetched where these fixtures were made, so LLaDA's folder
carries a stand-in vocabulary with the real special tokens. Opt-in, with the published files on disk:
``STABLEDRL_LLADA_TOKENIZER_DIR=/path/to/LLaDA-8B-Instruct python -m pytest tests/test_real_tokenizers.py`` copies
its ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into the folder instead, so every
test of the module (ids, the official prompts' token ids, end tokens, RL, lm-eval) runs on the real vocabulary.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from stabledrl_bench.core.models.convert import published_config, tiny_weights_as
from stabledrl_bench.core.models.tiny import TinyDLM, TinyDLMConfig

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tokenizers"
QWEN_BPE = FIXTURES / "qwen-bpe.tar.xz"  # vocab.json + merges.txt
LLADA_REGULAR = 126080  # LLaDA-8B-Instruct's ids below <|startoftext|> are its regular vocabulary
LLADA_TOKENIZER_DIR = os.environ.get("STABLEDRL_LLADA_TOKENIZER_DIR")  # opt-in: the published files (docstring)
LLADA_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class Family:
    """A family's published tokenizer: fixture folder, vocabulary size of the weights, the Python file its
    tokenizer config names (None: none), and the ids the harness must find (mask, EOS, pad, end of turn)."""

    fixture: str
    vocab_size: int
    code: str | None
    mask: int
    eos: int
    pad: int
    end_of_turn: int
    attention: str = "full"


FAMILIES = {
    # SDAR-8B-Chat: <|MASK|> (its added_tokens.json calls id 151669 "<MASK>", the tokenizer config "<|MASK|>"),
    # <|endoftext|> as EOS and pad, <|im_end|> ends a turn (its generation_config.json stops on both)
    "sdar": Family("sdar-8b-chat", 151936, "tokenization_qwen2.py", 151669, 151643, 151643, 151645, "block"),
    # Dream-v0-Instruct-7B: <|mask|> 151666, <|endoftext|> EOS and pad, <|im_end|> ends a turn
    "dream": Family("dream-v0-instruct-7b", 152064, "tokenization_dream.py", 151666, 151643, 151643, 151645),
    # LLaDA-8B-Instruct: <|mdm_mask|> 126336 (config.json's mask_token_id), <|endoftext|> 126081 EOS and pad,
    # <|eot_id|> 126348 ends a turn
    "llada": Family("llada-8b-instruct", 126464, None, 126336, 126081, 126081, 126348),
}


def llada_layout_tokenizer() -> Tokenizer:
    """A stand-in for LLaDA-8B-Instruct's ``tokenizer.json`` (not reachable here) with its exact special tokens.

    Ids 0-255 are the 256 byte-level symbols (GPT-2's byte-to-unicode map, in code point order), ids 256 to
    126079 fill the regular range with tokens ``<256>`` ... that encoding never produces but decoding can (random
    weights emit them), and ids 126080-126348 are the 269 special tokens of the published
    ``tokenizer_config.json``, added in id order. No merges: every byte is one token, so any answer is many
    tokens. The regular ids are not LLaDA's; the special tokens, their ids, the vocabulary size and the chat
    template are.
    """
    config = json.loads((FIXTURES / "llada-8b-instruct" / "tokenizer_config.json").read_text())
    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab |= {f"<{i}>": i for i in range(len(vocab), LLADA_REGULAR)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = sorted(config["added_tokens_decoder"].items(), key=lambda item: int(item[0]))
    tokenizer.add_special_tokens([entry["content"] for _, entry in special])
    assert all(tokenizer.token_to_id(entry["content"]) == int(i) for i, entry in special)
    return tokenizer


def write_checkpoint(family: str, folder: Path, seed: int = 0) -> Path:
    """A 1-layer random-weight native ``family`` folder (hidden 16) with the family's published tokenizer files."""
    spec = FAMILIES[family]
    config = TinyDLMConfig(
        vocab_size=spec.vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=1024,
        mask_token_id=spec.mask,
        eos_token_id=spec.eos,
        pad_token_id=spec.pad,
        attention_kind=spec.attention,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyDLM(config)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(published_config(config, family), indent=1))
    save_file(tiny_weights_as(model, family), str(folder / "model.safetensors"), metadata={"format": "pt"})
    for path in (FIXTURES / spec.fixture).iterdir():
        shutil.copy(path, folder / path.name)
    if family == "llada" and LLADA_TOKENIZER_DIR:
        published = Path(LLADA_TOKENIZER_DIR)
        if not (published / "tokenizer.json").is_file():
            raise FileNotFoundError(f"STABLEDRL_LLADA_TOKENIZER_DIR={published}: no tokenizer.json there")
        for name in LLADA_TOKENIZER_FILES:
            if (published / name).is_file():
                shutil.copy(published / name, folder / name)
    elif family == "llada":
        llada_layout_tokenizer().save(str(folder / "tokenizer.json"))
    else:
        with tarfile.open(QWEN_BPE) as archive:
            archive.extractall(folder, filter="data")
    if spec.code:
        (folder / spec.code).write_text(f"open({str(folder / 'RAN')!r}, 'w').write('ran')\n")
    return folder
