"""Rebuild the stand-in's tokenizer offline: a small byte-level BPE trained on ``train.jsonl``.

The real SmolLM2 tokenizer cannot be downloaded offline, and the stand-in has random weights anyway,
so any tokenizer that spells English text will do. Byte-level BPE (the GPT-2 / SmolLM2 family) can
spell every string, so no text is ever "unknown". Run from the repo root:

    .venv/bin/python data/standin/make_tokenizer.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
SPECIAL = "<|endoftext|>"  # id 0: bos = eos = pad, as in SmolLM2's config (bos_token_id 0, eos_token_id 0)
VOCAB_SIZE = 512


def build() -> Tokenizer:
    lines = [json.loads(line)["text"] for line in (HERE / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[SPECIAL],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def main() -> None:
    tok = build()
    tok.save(str(HERE / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL,
        "eos_token": SPECIAL,
        "pad_token": SPECIAL,
        "model_max_length": 8192,
        "clean_up_tokenization_spaces": False,
    }
    (HERE / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    print(f"wrote tokenizer.json ({tok.get_vocab_size()} tokens) and tokenizer_config.json in {HERE}")


if __name__ == "__main__":
    main()
