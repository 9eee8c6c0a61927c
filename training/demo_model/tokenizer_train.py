"""Train the demo model's byte-level BPE (`tokenizer.json`) on the corpus, with the Kimi special tokens.

The BPE is trained on the text between special tokens of corpus conversations rendered through the
model's chat template (`chat_template.jinja`): what the tokenizer meets when it serves.

Pre-tokenization: an attachment id (a UUID) is a piece of its own, so it has the same tokens in an
image's label and in the tool call that copies it; every digit is its own piece (a number is copied digit by digit from the question
into the tool call and from the tool result into the answer, which a small model learns easily);
every capitalised word is its own piece, so a made-up name (`Quador`) becomes the same tokens
wherever it stands (in the question, the search query, the passage, the answer) and copying it is
copying tokens; and no whitespace split otherwise (the constant tools declaration and the answer
templates become few tokens, which keeps training sequences short). Without the name rule, BPE
merged names with their neighbours (`. Ra` + `il is the `), so one name had different tokens in
the question and in the passage, and the model made names up instead of copying them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from inference.chat import BUNDLED_TEMPLATE_DIR, load_chat_template
from inference.tokenizer import KIMI_SPECIAL_TOKENS

__all__ = ["UUID_PATTERN", "collect_segments", "train_tokenizer"]

UUID_PATTERN = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def collect_segments(conversations: Iterable[tuple[list[dict], list[dict], dict[str, int]]]) -> Iterator[str]:
    """(messages, tools, image placeholder counts) -> the text between special tokens of their
    rendered prompts (an image is one special token there: its count does not matter)."""
    template = load_chat_template(BUNDLED_TEMPLATE_DIR)
    split = re.compile("|".join(map(re.escape, KIMI_SPECIAL_TOKENS)))
    for messages, tools, _ in conversations:
        yield from (
            p for p in split.split(template.render(messages, tools, add_generation_prompt=False)) if p
        )


def train_tokenizer(pieces: Iterable[str], vocab_size: int, out: str | Path) -> Path:
    """Train and save `tokenizer.json`; returns its path. Special tokens get the first ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(UUID_PATTERN), behavior="isolated"),
            pre_tokenizers.Split(Regex("[A-Z][a-z]+"), behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(KIMI_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(pieces, trainer=trainer)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path
