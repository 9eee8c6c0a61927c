"""Tokenizers of the engine: a checkpoint's own (`load_tokenizer`: `tokenizer.json` or the tiktoken
layout) and the byte tokenizer of random-weight models; incremental detokenization for each."""

from inference.tokenizer.base import Tokenizer, TokenizerFilesError
from inference.tokenizer.byte import KIMI_SPECIAL_TOKENS, ByteTokenizer
from inference.tokenizer.checkpoint import load_tokenizer, read_json
from inference.tokenizer.detok import make_detokenizer
from inference.tokenizer.hf import HFTokenizer
from inference.tokenizer.tiktoken_layout import TiktokenTokenizer

__all__ = [
    "KIMI_SPECIAL_TOKENS",
    "ByteTokenizer",
    "HFTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "TokenizerFilesError",
    "load_tokenizer",
    "make_detokenizer",
    "read_json",
]
