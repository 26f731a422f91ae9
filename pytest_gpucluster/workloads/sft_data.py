"""Alpaca-format SFT data: loading, prompts, tokenization, label masking, fixed-length batches.

Follows Stanford Alpaca's ``train.py``: the same two prompt templates, the response followed
by the end-of-sequence token, and the prompt's tokens masked out of the loss with -100 (the
prompt is tokenized on its own and its length masked, as there). Unlike Alpaca, which pads
to the longest sequence of a batch, every batch here is padded or truncated to exactly
``seq_len``, so that each step processes the same number of tokens and step times compare.

Without a local tokenizer, a byte-level one is built in (each UTF-8 byte one id, after four
special ids), so the workload never downloads anything. ``generate_dataset`` makes the small
Alpaca-style file shipped in ``data/`` (``python -m pytest_gpucluster.workloads.sft_data``).

Rank-side module: the standard library and, lazily, torch and ``transformers`` only.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "DEFAULT_DATASET",
    "IGNORE_INDEX",
    "PROMPT_INPUT",
    "PROMPT_NO_INPUT",
    "ByteTokenizer",
    "Example",
    "Tokenized",
    "Tokenizer",
    "batches_for_rank",
    "collate",
    "generate_dataset",
    "load_examples",
    "load_tokenizer",
    "prompt_of",
    "tokenize_dataset",
    "tokenize_example",
]

IGNORE_INDEX = -100
"""Label value that PyTorch's cross-entropy (and so every HF causal LM) leaves out of the loss."""

# Stanford Alpaca's PROMPT_DICT, verbatim.
PROMPT_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
)
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:"
)

DEFAULT_DATASET = Path(__file__).with_name("data") / "alpaca_tiny.json"


@dataclass(frozen=True, slots=True)
class Example:
    """One Alpaca record."""

    instruction: str
    input: str
    output: str


def prompt_of(example: Example) -> str:
    """The prompt (Alpaca's "source"): the template with input when the input is not empty."""
    template = PROMPT_INPUT if example.input != "" else PROMPT_NO_INPUT
    return template.format(instruction=example.instruction, input=example.input)


def load_examples(path: str | Path) -> list[Example]:
    """Read an Alpaca JSON file: a list of objects with ``instruction``, ``output``, optional ``input``."""
    path = Path(path)
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"SFT data file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"SFT data file {path} is not valid JSON: {exc}") from None
    if not isinstance(records, list) or not records:
        raise ValueError(f"SFT data file {path} must hold a non-empty JSON list of Alpaca records")
    examples = []
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{path}: record [{index}] is a {type(record).__name__}, not an object")
        for key in ("instruction", "output"):
            if not isinstance(record.get(key), str):
                raise ValueError(f"{path}: record [{index}] has no string {key!r} (keys: {sorted(record)})")
        extra = record.get("input", "")
        if not isinstance(extra, str):
            raise ValueError(f"{path}: record [{index}] has an 'input' that is not a string")
        examples.append(Example(record["instruction"], extra, record["output"]))
    return examples


# --------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    pad_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, with the beginning-of-sequence id when the tokenizer adds one."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as ids 4..259 after pad=0, bos=1, eos=2, unk=3: fits any model of >= 260 ids."""

    name = "byte-level (built in)"
    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3
    offset = 4
    vocab_size = 256 + offset

    def encode(self, text: str) -> list[int]:
        return [self.bos_id, *(b + self.offset for b in text.encode("utf-8"))]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i - self.offset for i in ids if i >= self.offset).decode("utf-8", errors="replace")


class _LocalTokenizer:
    """A ``transformers`` tokenizer from a local directory, behind the :class:`Tokenizer` face."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.name = f"{type(self._tok).__name__} from {path}"
        self.vocab_size = len(self._tok)
        if self._tok.eos_token_id is None:
            raise ValueError(f"the tokenizer in {path} has no end-of-sequence token, which SFT targets need")
        self.eos_id = int(self._tok.eos_token_id)
        # Alpaca adds a [PAD] token and resizes the embeddings; any id will do here, because
        # padding is masked by position (attention_mask, labels -100), never by comparing ids.
        pad = self._tok.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_id)

    def encode(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=True)["input_ids"])


def load_tokenizer(path: str | Path | None) -> Tokenizer:
    """The local tokenizer at ``path``, or the built-in byte-level one when ``path`` is None."""
    if path is None or str(path) == "":
        return ByteTokenizer()
    if not Path(path).is_dir():
        raise ValueError(f"tokenizer path {path} is not a local directory (nothing is downloaded)")
    return _LocalTokenizer(path)


# --------------------------------------------------------------------------------------------
# Tokenization with Alpaca's label masking
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tokenized:
    """One example as ids, at most ``seq_len`` long; ``labels`` is -100 over the prompt."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]


def tokenize_example(example: Example, tokenizer: Tokenizer, seq_len: int) -> Tokenized | None:
    """Prompt + response + EOS, truncated to ``seq_len``; None if no response token survives."""
    source_ids = tokenizer.encode(prompt_of(example))
    full_ids = tokenizer.encode(prompt_of(example) + example.output)
    if not full_ids or full_ids[-1] != tokenizer.eos_id:
        full_ids.append(tokenizer.eos_id)
    full_ids = full_ids[:seq_len]
    masked = min(len(source_ids), len(full_ids))
    labels = [IGNORE_INDEX] * masked + full_ids[masked:]
    if masked == len(full_ids):
        return None  # the prompt fills the whole window: nothing to learn, and a NaN loss
    return Tokenized(tuple(full_ids), tuple(labels))


def tokenize_dataset(examples: Sequence[Example], tokenizer: Tokenizer, seq_len: int) -> list[Tokenized]:
    """Every example that keeps at least one response token; ValueError when none does."""
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    items = [t for t in (tokenize_example(e, tokenizer, seq_len) for e in examples) if t is not None]
    if not items:
        shortest = min(len(tokenizer.encode(prompt_of(e))) for e in examples)
        raise ValueError(
            f"seq_len={seq_len} leaves no response token in any of the {len(examples)} examples "
            f"(the shortest prompt is {shortest} tokens with the {tokenizer.name} tokenizer); "
            f"raise seq_len above {shortest}"
        )
    return items


def collate(items: Sequence[Tokenized], pad_id: int, seq_len: int) -> dict[str, Any]:
    """Right-pad to exactly ``seq_len``: ``input_ids``, ``labels`` (-100 on padding), ``attention_mask``."""
    import torch

    n = len(items)
    input_ids = torch.full((n, seq_len), pad_id, dtype=torch.long)
    labels = torch.full((n, seq_len), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((n, seq_len), dtype=torch.long)
    for row, item in enumerate(items):
        length = len(item.input_ids)
        input_ids[row, :length] = torch.tensor(item.input_ids, dtype=torch.long)
        labels[row, :length] = torch.tensor(item.labels, dtype=torch.long)
        attention_mask[row, :length] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def batches_for_rank(
    items: Sequence[Tokenized],
    micro_batch: int,
    seq_len: int,
    pad_id: int,
    rank: int,
    world_size: int,
    seed: int,
    count: int,
) -> list[dict[str, Any]]:
    """Up to ``count`` micro-batches of one data-parallel rank, at most one pass over the data.

    The order is one seeded shuffle shared by all ranks; micro-batch i of rank r holds positions
    ``(i * world_size + r) * micro_batch ...`` of it, so ranks draw disjoint examples. A run
    longer than one pass cycles through the list.
    """
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be at least 1, got {micro_batch}")
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    stride = world_size * micro_batch
    count = max(min(count, len(items) // stride), 1)
    batches = []
    for i in range(count):
        first = i * stride + rank * micro_batch
        batches.append(
            collate([items[order[(first + k) % len(order)]] for k in range(micro_batch)], pad_id, seq_len)
        )
    return batches


# --------------------------------------------------------------------------------------------
# The shipped dataset
# --------------------------------------------------------------------------------------------

_WORDS = (  # noqa: SIM905 - a sentence of words reads better than 24 one-word lines
    "apple river stone garden window yellow planet silver candle forest music bridge "
    "orange winter pencil rocket island coffee thunder lantern mirror castle dragon meadow"
).split()
_OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "early": "late", "happy": "sad", "light": "dark",
    "open": "closed", "full": "empty", "strong": "weak", "high": "low", "old": "new", "wet": "dry",
}  # fmt: skip
_CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Kenya": "Nairobi",
    "Canada": "Ottawa", "Egypt": "Cairo", "Norway": "Oslo", "Peru": "Lima", "Chile": "Santiago",
}  # fmt: skip
_COLOURS = {
    "banana": "yellow", "grass": "green", "sky": "blue", "snow": "white", "coal": "black",
    "tomato": "red", "carrot": "orange", "plum": "purple",
}  # fmt: skip


def _record(rng: random.Random) -> dict[str, str]:
    kind = rng.randrange(8)
    word = rng.choice(_WORDS)
    if kind == 0:
        return {"instruction": "Reverse the letters of the given word.", "input": word, "output": word[::-1]}
    if kind == 1:
        phrase = " ".join(rng.sample(_WORDS, 3))
        return {"instruction": "Rewrite the text in upper case.", "input": phrase, "output": phrase.upper()}
    if kind == 2:
        a, b = rng.randrange(100), rng.randrange(100)
        return {
            "instruction": "Add the two numbers.",
            "input": f"{a} and {b}",
            "output": f"The sum is {a + b}.",
        }
    if kind == 3:
        country = rng.choice(sorted(_CAPITALS))
        return {
            "instruction": f"What is the capital of {country}?",
            "input": "",
            "output": f"The capital of {country} is {_CAPITALS[country]}.",
        }
    if kind == 4:
        return {
            "instruction": "Count the letters in the word.",
            "input": word,
            "output": f"{len(word)} letters.",
        }
    if kind == 5:
        numbers = rng.sample(range(1, 50), 4)
        return {
            "instruction": "Sort the numbers from smallest to largest.",
            "input": ", ".join(map(str, numbers)),
            "output": ", ".join(map(str, sorted(numbers))),
        }
    if kind == 6:
        adjective = rng.choice(sorted(_OPPOSITES))
        return {
            "instruction": f"Give the opposite of the word '{adjective}'.",
            "input": "",
            "output": _OPPOSITES[adjective].capitalize() + ".",
        }
    thing = rng.choice(sorted(_COLOURS))
    return {
        "instruction": f"Name the usual colour of {thing}.",
        "input": "",
        "output": f"{thing.capitalize()} is usually {_COLOURS[thing]}.",
    }


def generate_dataset(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` short, learnable Alpaca-format records, the same for the same ``seed``."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rng = random.Random(seed)
    return [_record(rng) for _ in range(n)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the small generated Alpaca-format SFT dataset.")
    parser.add_argument("--n", type=int, default=256, help="number of records (default 256)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_DATASET)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(generate_dataset(args.n, args.seed), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.n} records to {args.out}")


if __name__ == "__main__":
    main()
