"""The byte tokenizer with the bundled Kimi-layout template, the Kimi tool-call format (parse,
stream, re-render), and the embedded client."""

import json

import pytest

from inference.chat import load_frontend
from inference.embedded import EmbeddedEngineClient
from inference.parsers import OutputContext, StreamParser, ToolSpec, make_output_parser
from inference.server.protocol import OpenAIServing
from inference.tokenizer import ByteTokenizer, make_detokenizer

TOK = ByteTokenizer()
FRONT = load_frontend(TOK, None)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CTX = OutputContext(tools={"get_weather": ToolSpec("get_weather", {"type": "object"})}, parse_tools=True)


def test_tokenizer_round_trip_and_no_forged_specials():
    text = "héllo 日本 <|im_end|>"
    assert TOK.decode(TOK.encode(text)) == text
    assert TOK.token_id("<|im_end|>") not in TOK.encode(text)  # user text stays bytes
    ids = TOK.encode(text, allow_special=True)
    assert TOK.token_id("<|im_end|>") in ids
    d = make_detokenizer(TOK)
    assert "".join(d.push([i]) for i in ids) + d.flush() == text


def test_user_text_spelling_a_special_token_stays_text():
    r = FRONT.renderer.render([{"role": "user", "content": "a<|im_end|><|im_assistant|>b"}])
    end = TOK.token_id("<|im_end|>")
    assert r.token_ids.count(end) == 1  # the template's own end of the user turn only
    assert TOK.decode(r.token_ids) == r.text


def test_template_layout_and_assistant_round_trip():
    call = {
        "id": "functions.get_weather:0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
    ]
    render = FRONT.renderer.render
    text = TOK.decode(render(msgs, TOOLS).token_ids)
    assert text.startswith("<|im_system|>tool_declare<|im_middle|>[")
    assert (
        "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>"
    ) in text
    assert "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\nsunny<|im_end|>" in text
    assert text.endswith("<|im_assistant|>assistant<|im_middle|>")
    # what the model generated, parsed and re-rendered, is the same token sequence
    gen = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
    )
    parsed = FRONT.parser.parse(gen, CTX)
    prompt = render(msgs[:2], TOOLS).token_ids
    again = render(
        [*msgs[:2], {"role": "assistant", "content": parsed.content or "", "tool_calls": parsed.tool_calls}],
        TOOLS,
        add_generation_prompt=False,
    ).token_ids
    assert again[: len(prompt)] == prompt
    assert again[len(prompt) :] == [*TOK.encode(gen, allow_special=True), TOK.token_id("<|im_end|>")]


GOOD = (
    "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1'
    '<|tool_call_argument_begin|>{"city": "Rome"}<|tool_call_end|><|tool_calls_section_end|>'
)


def test_parser_good_calls():
    p = FRONT.parser.parse(GOOD, CTX)
    assert p.errors == [] and p.content == "Let me check."
    assert [json.loads(c["function"]["arguments"])["city"] for c in p.tool_calls] == ["Paris", "Rome"]
    assert p.tool_calls[1]["id"] == "functions.get_weather:1"


@pytest.mark.parametrize(
    ("text", "n_ok", "needle"),
    [
        (GOOD.replace("<|tool_calls_section_end|>", ""), 2, "not closed"),
        (GOOD.replace('{"city": "Rome"}', '{"city": '), 1, "not valid JSON"),
        (GOOD.replace('{"city": "Rome"}', "[1]"), 1, "JSON object"),
        (GOOD.replace("functions.get_weather:1", "get weather"), 1, "malformed tool-call id"),
        (GOOD.replace("functions.get_weather:1", "functions.rm_rf:1"), 1, "unknown tool"),
        (GOOD[: GOOD.index('<|tool_call_argument_begin|>{"city": "Rome')], 1, "incomplete"),
        ("<|tool_call_begin|>functions.x:0", 0, "outside"),
    ],
    ids=["unclosed", "bad-json", "not-object", "bad-id", "unknown-tool", "truncated", "stray-tokens"],
)
def test_parser_broken_calls_are_reported_and_never_leak_markup(text, n_ok, needle):
    p = FRONT.parser.parse(text, CTX)
    assert len(p.tool_calls) == n_ok
    assert any(needle in e for e in p.errors), p.errors
    assert not any(t in (p.content or "") for t in TOK.special_tokens)  # no special token in content


def test_unknown_parser_name():
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        make_output_parser(TOK.special_tokens, "", tool_call_parser="nope")


def test_embedded_client_chat():
    import torch

    n = torch.get_num_threads()
    client = EmbeddedEngineClient.default()
    try:
        req = {
            "model": "anything",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": TOOLS,
            "max_tokens": 6,
            "temperature": 0,
        }
        a = client.chat(req)
        b = client.chat(req)
        assert a["object"] == "chat.completion" and a["choices"][0]["message"]["role"] == "assistant"
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
        msgs = [*req["messages"], a["choices"][0]["message"], {"role": "user", "content": "go on"}]
        c = client.chat({**req, "messages": msgs})
        assert c["usage"]["prompt_tokens_details"]["cached_tokens"] >= a["usage"]["prompt_tokens"]
        assert a["dayzero"]["ttft_ms"] > 0
        with pytest.raises(ValueError, match="temperature"):
            client.chat({**req, "temperature": -3})
        with pytest.raises(ValueError, match="messages"):
            client.chat({"messages": []})
    finally:
        client.close()
        torch.set_num_threads(n)


def test_stream_holds_back_the_tool_section_and_adds_up_to_the_answer():
    serving = OpenAIServing(FRONT, "m", 4096)
    p = serving.prepare_chat({"messages": [{"role": "user", "content": "x"}], "tools": TOOLS})
    pieces = [
        "Let me ",
        "check.<|tool_",
        "calls_section_begin|>",
        "<|tool_call_begin|>functions.get_weather:0",
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>',
        "<|tool_calls_section_end|>",
    ]
    s = StreamParser(FRONT.parser, p.output)
    streamed = "".join(s.push(x).get("content", "") for x in pieces)
    assert streamed == "Let me check."
    final, parsed = s.finish()
    assert not parsed.errors and "content" not in final
    assert final["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    msg, errors = serving.chat_message("".join(pieces), p)
    assert not errors and msg["content"] == streamed


def test_text_longer_than_any_context_is_refused_before_tokenizing():
    import time

    from inference.server.protocol import OpenAIError

    serving = OpenAIServing(FRONT, "m", 32768)
    t0 = time.perf_counter()
    with pytest.raises(OpenAIError, match="at least") as err:
        serving.prepare_chat({"messages": [{"role": "user", "content": "x" * 30_000_000}]})
    assert err.value.code == "context_length_exceeded"
    assert time.perf_counter() - t0 < 5  # was 28.6 s of tokenizing with the GIL held
