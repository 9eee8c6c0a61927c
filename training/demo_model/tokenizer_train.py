"""Train the demo model's byte-level BPE (`tokenizer.json`) on the corpus, with the Kimi special tokens.

The chat template encodes each piece of a conversation separately (role names, message texts, tool
call ids, arguments, the tools JSON), so the BPE is trained on exactly those pieces, collected by
rendering corpus conversations (`training.demo_model.render`) with a recording tokenizer.

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

from collections.abc import Iterable, Iterator
from pathlib import Path

from inference.tokenizer import KIMI_SPECIAL_TOKENS
from training.demo_model.render import render

__all__ = ["UUID_PATTERN", "collect_segments", "train_tokenizer"]

UUID_PATTERN = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


class _Recorder:
    """Just enough of the `Tokenizer` protocol for `ChatTemplate.render`: records each text piece."""

    vocab_size = 0
    bos_token_id = None
    eos_token_ids = ()

    def __init__(self) -> None:
        self.pieces: list[str] = []

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
        if text:
            self.pieces.append(text)
        return []

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        return ""

    def token_id(self, token: str) -> int:
        return 0

    def is_special(self, token_id: int) -> bool:
        return False


def collect_segments(conversations: Iterable[tuple[list[dict], list[dict], dict[str, int]]]) -> Iterator[str]:
    """(messages, tools, image placeholder counts) -> the text pieces the chat template encodes."""
    rec = _Recorder()
    for messages, tools, image_tokens in conversations:
        render(rec, messages, tools, image_tokens)
        yield from rec.pieces
        rec.pieces.clear()


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
