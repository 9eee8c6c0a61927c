"""Every family's tool-call and reasoning format: parsed whole and streamed (the stream's deltas add
up to the whole answer's content and reasoning, whatever the chunking), parallel calls, broken
calls reported without markup in the content, and the grammar of each format accepting the text
its parser reads."""

from __future__ import annotations

import json

import llguidance
import pytest

from inference.parsers import OutputContext, StreamParser, ToolSpec, make_output_parser
from inference.structured import build_grammar
from inference.tokenizer import ByteTokenizer

TOOLS = [
    ToolSpec(
        "get_weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
    ToolSpec("add", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}),
]
BY_NAME = {t.name: t for t in TOOLS}

KIMI = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.add:1<|tool_call_argument_begin|>'
    '{"a": 1, "b": 2}<|tool_call_end|><|tool_calls_section_end|>'
)
DEEPSEEK = (
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
    '<｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 1, "b": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)
HERMES = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
)
XML = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>"
)
FAMILIES = {
    # name: (special tokens of the family's tokenizer, parser name, the calls as the model writes them)
    "kimi_k2": (
        ["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
         "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>", "<|im_end|>"],
        KIMI,
    ),
    "deepseek_v31": (
        ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
         "<｜tool▁call▁end｜>", "<think>", "</think>", "<｜end▁of▁sentence｜>", "<|im_end|>"],
        DEEPSEEK,
    ),
    "hermes": (["<|im_end|>"], HERMES),
    "qwen3_xml": (["<|im_end|>"], XML),
}  # fmt: skip
WANT = [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]


def family(name: str):
    specials, calls = FAMILIES[name]
    tok = ByteTokenizer(specials)
    parser = make_output_parser(tok.special_tokens, "", tool_call_parser=name, reasoning_parser="think")
    return tok, parser, calls


def calls_of(parsed) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]


def chunked(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_whole_answer_with_reasoning_text_and_parallel_calls(name):
    _, parser, calls = family(name)
    text = f"<think>Two tools.</think>Let me check. {calls}"
    p = parser.parse(text, OutputContext(tools=BY_NAME, parse_tools=True))
    assert not p.errors, p.errors
    assert p.reasoning == "Two tools." and p.content == "Let me check. "
    assert calls_of(p) == WANT


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_streamed_deltas_add_up_to_the_whole_answer(name, size):
    _, parser, calls = family(name)
    ctx = OutputContext(tools=BY_NAME, parse_tools=True)
    text = f"<think>Two tools.</think>Let me check. {calls}"
    stream = StreamParser(parser, ctx)
    got = {"reasoning_content": "", "content": ""}
    for piece in chunked(text, size):
        for k, v in stream.push(piece).items():
            got[k] += v
    final, whole = stream.finish()
    for k in ("reasoning_content", "content"):
        got[k] += final.get(k, "")
    assert got == {"reasoning_content": "Two tools.", "content": "Let me check. "}
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in final["tool_calls"]
    ] == WANT
    assert whole.content == parser.parse(text, ctx).content


def test_the_prompt_can_leave_the_model_inside_its_reasoning():
    _, parser, calls = family("deepseek_v31")
    ctx = OutputContext(tools=BY_NAME, parse_tools=True, inside_reasoning=True)
    p = parser.parse(f"thinking about it</think>{calls}", ctx)
    assert p.reasoning == "thinking about it" and p.content is None and calls_of(p) == WANT
    assert parser.reasoning.starts_inside("<｜Assistant｜><think>\n")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_broken_calls_are_errors_and_content_has_no_markup(name):
    tok, parser, calls = family(name)
    ctx = OutputContext(tools=BY_NAME, parse_tools=True)
    broken = [
        calls.replace('"Paris"}', '"Paris"').replace("</function>", "", 1),  # bad JSON / unclosed block
        calls.replace("get_weather", "rm_rf", 1),  # a tool that was not offered
        calls[: len(calls) // 2],  # generation stopped inside the calls
    ]
    for text in broken:
        p = parser.parse("Sure. " + text, ctx)
        assert p.errors, text
        assert p.content == "Sure. "
        assert not any(t in (p.content or "") for t in tok.special_tokens)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_format_grammar_accepts_what_its_parser_reads(name):
    tok, parser, calls = family(name)
    for choice, text in (
        ("required", calls),
        ("auto", "Let me check. " + calls),
        ("auto", "No tool needed."),
    ):
        grammar = build_grammar(parser, tools=TOOLS, tool_choice=choice)
        m = llguidance.LLMatcher(
            tok.grammar_tokenizer(), llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0
        )
        ids = tok.encode(text, allow_special=True)
        assert m.consume_tokens(ids), (choice, m.get_error())
        assert m.is_accepting(), choice
    one = build_grammar(parser, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    m = llguidance.LLMatcher(
        tok.grammar_tokenizer(), llguidance.LLMatcher.grammar_from_lark(one), log_level=0
    )
    assert not m.consume_tokens(tok.encode(calls, allow_special=True))  # get_weather is not allowed there
