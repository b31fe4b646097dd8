"""Write the assets torchtitan's debug model reads, which its wheel does not ship, under
`<dir>/tests/assets` (start torchtitan in `<dir>`): a byte-level BPE tokenizer of 395 tokens
(under the debug model's vocabulary of 2,048) with bos/eos, and a `c4_test` data set of 2,000
JSON lines of seeded random text. The same bytes every time.

    python make_assets.py DIR
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

WORDS = [
    *("tier", "point", "checkpoint", "shard", "tensor", "model", "train", "step", "loss"),
    *("gradient", "storage", "writer", "reader", "the", "a", "of", "and", "to", "in", "is"),
    *("for", "with", "on", "data", "layer", "attention", "token", "batch", "rank", "world"),
    *("save", "load", "resume"),
]
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def documents(count: int = 2000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))) + "."

    return [" ".join(sentence() for _ in range(rng.randint(5, 30))) for _ in range(count)]


def make_assets(root: Path) -> Path:
    assets = root / "tests" / "assets"
    (assets / "c4_test").mkdir(parents=True, exist_ok=True)
    (assets / "tokenizer").mkdir(parents=True, exist_ok=True)
    docs = documents()
    with open(assets / "c4_test" / "data.json", "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(docs, trainer)
    tokenizer.save(str(assets / "tokenizer" / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True}
    (assets / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(config))
    return assets


if __name__ == "__main__":
    make_assets(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
