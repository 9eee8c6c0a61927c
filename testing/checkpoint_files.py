"""The tokenizer files of a random-weight test checkpoint: a `tokenizer.json` whose ids are those of
the byte tokenizer (the 256 bytes, then the Kimi special tokens; no merges), its
`tokenizer_config.json` / `generation_config.json`, and the bundled Kimi-layout chat template, so
a checkpoint saved from a random model serves exactly as `--dummy` does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from inference.chat import BUNDLED_TEMPLATE_DIR
from inference.tokenizer import KIMI_SPECIAL_TOKENS, ByteTokenizer


def write_byte_tokenizer(folder: Path) -> Path:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins, in byte order
    byte_of = {c: b for b, c in _bytes_to_unicode().items()}
    vocab = {c: byte_of[c] for c in alphabet}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in KIMI_SPECIAL_TOKENS])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    byte = ByteTokenizer()
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "[BOS]", "eos_token": "[EOS]"}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": list(byte.eos_token_ids)}))
    shutil.copy(BUNDLED_TEMPLATE_DIR / "chat_template.jinja", folder / "chat_template.jinja")
    return folder


def _bytes_to_unicode() -> dict[int, str]:
    from inference.tokenizer.hf import _bytes_to_unicode

    return _bytes_to_unicode()
