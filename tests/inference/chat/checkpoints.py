"""Tiny checkpoints in each family's release layout, built from scratch: their own BPE (a
`tokenizer.json` trained with `tokenizers`, or `tiktoken.model` ranks learned here), their own chat
templates in each family's style (tools, a default system prompt, multi-turn tool results,
thinking), and random weights of a small Kimi-Linear model sized to the vocabulary."""

from __future__ import annotations

import base64
import collections
import itertools
import json
from pathlib import Path

CORPUS = [
    "The weather in Paris is sunny today, 21 degrees.",
    "Call the calculator with the expression 17 * 23 and report the result.",
    "Search the documents for the quarterly report and summarise it.",
    "def add(a, b):\n    return a + b\n",
    "東京の天気は晴れです。 Ünïcödé text, émojis 🙂 and tabs\tand  spaces.",
] * 4

KIMI_SPECIALS = [
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
    "<|media_start|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>",
]  # fmt: skip

KIMI_TEMPLATE = """\
{%- macro text(m) -%}
{%- if m.content is string -%}{{ m.content }}
{%- elif m.content -%}{%- for p in m.content -%}{%- if p.type == 'text' -%}{{ p.text }}{%- else -%}<|media_start|>image<|media_content|><|media_pad|><|media_end|>{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>{%- endif -%}
{%- if messages[0].role != 'system' -%}<|im_system|>system<|im_middle|>You are a helpful assistant, built to be precise.<|im_end|>{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}<|im_user|>user<|im_middle|>{{ text(m) }}<|im_end|>
{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>
{%- if m.reasoning_content -%}<think>{{ m.reasoning_content }}</think>{%- endif -%}
{{ text(m) }}
{%- if m.tool_calls -%}<|tool_calls_section_begin|>
{%- for c in m.tool_calls -%}<|tool_call_begin|>{{ c.id }}<|tool_call_argument_begin|>{{ c.function.arguments }}<|tool_call_end|>{%- endfor -%}
<|tool_calls_section_end|>{%- endif -%}<|im_end|>
{%- elif m.role == 'tool' -%}<|im_system|>tool<|im_middle|>## Return of {{ m.tool_call_id }}
{{ text(m) }}<|im_end|>
{%- else -%}<|im_system|>{{ m.role }}<|im_middle|>{{ text(m) }}<|im_end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- if thinking -%}<think>{%- endif -%}{%- endif -%}
"""

DEEPSEEK_SPECIALS = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
]  # fmt: skip

DEEPSEEK_TEMPLATE = """\
{{ bos_token }}
{%- set ns = namespace(system='') -%}
{%- for m in messages if m.role == 'system' -%}{%- set ns.system = ns.system + m.content -%}{%- endfor -%}
{{ ns.system }}
{%- if tools %}

## Tools
{% for t in tools %}
### {{ t.function.name }}
Description: {{ t.function.description }}
Parameters: {{ t.function.parameters | tojson }}
{% endfor %}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}<｜User｜>{{ m.content }}
{%- elif m.role == 'assistant' -%}<｜Assistant｜></think>{{ m.content or '' }}
{%- if m.tool_calls -%}<｜tool▁calls▁begin｜>
{%- for c in m.tool_calls -%}<｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>{{ c.function.arguments }}<｜tool▁call▁end｜>{%- endfor -%}
<｜tool▁calls▁end｜>{%- endif -%}<｜end▁of▁sentence｜>
{%- elif m.role == 'tool' -%}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<｜Assistant｜>{%- if thinking -%}<think>{%- else -%}</think>{%- endif -%}{%- endif -%}
"""

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_PLAIN_ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>"]  # added, not special

QWEN_TEMPLATE = """\
{%- if tools -%}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>

Call a function with a JSON object inside <tool_call></tool_call> tags.<|im_end|>
{% elif messages[0].role == 'system' -%}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}
<|im_start|>user
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' -%}
<|im_start|>assistant
{{ m.content or '' }}
{%- for c in m.tool_calls or [] %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif -%}
{%- endif -%}
"""


def _learn_ranks(corpus: list[str], merges: int) -> dict[bytes, int]:
    """Byte-pair ranks learned on `corpus` (tiktoken's mergeable ranks: bytes 0..255 first)."""
    ranks = {bytes([i]): i for i in range(256)}
    words = collections.Counter(w for text in corpus for w in text.encode().split(b" "))
    seqs = {w: [bytes([b]) for b in w] for w in words}
    for _ in range(merges):
        pairs: collections.Counter = collections.Counter()
        for w, n in words.items():
            s = seqs[w]
            for a, b in itertools.pairwise(s):
                pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = pairs.most_common(1)[0]
        ranks.setdefault(a + b, len(ranks))
        for w in seqs:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return ranks


def _added(specials: list[str], first_id: int, plain: list[str] = ()) -> dict[str, dict]:
    out = {}
    for i, t in enumerate([*specials, *plain]):
        out[str(first_id + i)] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": t in specials,
        }  # fmt: skip
    return out


def kimi_layout(d: Path) -> Path:
    """`tiktoken.model` + `tokenizer_config.json` (`added_tokens_decoder`, auto_map to the family's
    tokenizer module) + `chat_template.jinja`, as the Kimi releases ship them."""
    d.mkdir(parents=True, exist_ok=True)
    ranks = _learn_ranks(CORPUS, 120)
    (d / "tiktoken.model").write_text(
        "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in sorted(ranks.items(), key=lambda x: x[1]))
    )
    config = {
        "added_tokens_decoder": _added(KIMI_SPECIALS, len(ranks)),
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
    }
    (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": len(ranks) + 2}))  # <|im_end|>
    (d / "chat_template.jinja").write_text(KIMI_TEMPLATE)
    return d


def _tokenizer_json(d: Path, specials: list[str], plain: list[str] = ()) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.add_tokens(list(plain))
    tok.save(str(d / "tokenizer.json"))


def deepseek_layout(d: Path) -> Path:
    """`tokenizer.json` + `tokenizer_config.json` carrying the chat template, as DeepSeek-V3.x."""
    d.mkdir(parents=True, exist_ok=True)
    _tokenizer_json(d, DEEPSEEK_SPECIALS)
    config = {
        "added_tokens_decoder": _added(DEEPSEEK_SPECIALS, 0),
        "bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>", "special": True},
        "eos_token": {"__type": "AddedToken", "content": "<｜end▁of▁sentence｜>", "special": True},
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": DEEPSEEK_TEMPLATE,
    }
    (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))
    return d


def qwen_layout(d: Path) -> Path:
    """`tokenizer.json` (special and plain added tokens) + `chat_template.jinja`, as Qwen3."""
    d.mkdir(parents=True, exist_ok=True)
    _tokenizer_json(d, QWEN_SPECIALS, QWEN_PLAIN_ADDED)
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(d / "tokenizer.json")).token_to_id
    config = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (d / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [ids("<|im_end|>"), ids("<|endoftext|>")]})
    )
    (d / "chat_template.jinja").write_text(QWEN_TEMPLATE)
    return d


def add_weights(d: Path, vocab_size: int, *, seed: int = 0) -> Path:
    """Random weights of the small Kimi-Linear test model over `vocab_size` ids, saved as a
    checkpoint (`config.json`, safetensors, manifest)."""
    from inference.config import parse_config
    from inference.engine.factory import small_model_config
    from inference.loader import save_sharded
    from inference.model.factory import build_model

    config = small_model_config(vocab_size=vocab_size)
    model = build_model(
        parse_config(config), load_format="dummy", dtype=__import__("torch").float32, seed=seed
    )
    save_sharded(model.state_dict(), d)
    (d / "config.json").write_text(json.dumps(config, indent=2))
    return d
