"""Checkpoints served as released: each family's layout gives exactly the prompt ids of the
reference (transformers' `apply_chat_template` on the same files; the tiktoken layout: the same
template rendered by transformers, tokenized by tiktoken with the same ranks and pattern), through
the renderer and through the HTTP server (`/tokenize`, `usage.prompt_tokens`), and the prefix
cache reuses what a jinja-templated conversation shares."""

from __future__ import annotations

import json

import httpx
import pytest

from inference.chat import load_chat_template, load_frontend
from inference.tokenizer import TokenizerFilesError, load_tokenizer
from inference.tokenizer.tiktoken_layout import TIKTOKEN_FAMILIES, read_ranks
from tests.inference.chat import checkpoints

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = {
    "id": "functions.get_weather:0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
CONVERSATIONS = {
    "one-turn": ([{"role": "user", "content": "What is 17 * 23?"}], None, {}),
    "system-and-tools": (
        [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        [WEATHER],
        {},
    ),
    "tool-result-multi-turn": (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {
                "role": "tool",
                "tool_call_id": "functions.get_weather:0",
                "content": '{"temp": 21, "sky": "sunny"}',
            },
            {"role": "assistant", "content": "It is sunny, 21 degrees."},
            {"role": "user", "content": "東京は？ Ünïcödé 🙂\tand  spaces"},
        ],
        [WEATHER],
        {},
    ),
    "thinking": (
        [
            {"role": "user", "content": "Think first: 2 + 2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "two and two"},
            {"role": "user", "content": "and 3 + 3?"},
        ],
        None,
        {"thinking": True, "enable_thinking": False},
    ),
}
LAYOUTS = {
    "kimi": checkpoints.kimi_layout,
    "deepseek": checkpoints.deepseek_layout,
    "qwen": checkpoints.qwen_layout,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: make(tmp_path_factory.mktemp(name)) for name, make in LAYOUTS.items()}


def reference_ids(layout: str, d, messages, tools, kwargs) -> list[int]:
    if layout == "kimi":
        import tiktoken
        from transformers.utils.chat_template_utils import render_jinja_template

        cfg = json.loads((d / "tokenizer_config.json").read_text())
        text = render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=(d / "chat_template.jinja").read_text(),
            add_generation_prompt=True,
            bos_token=cfg["bos_token"],
            eos_token=cfg["eos_token"],
            **kwargs,
        )[0][0]
        specials = {t["content"]: int(i) for i, t in cfg["added_tokens_decoder"].items()}
        ranks = read_ranks(d / "tiktoken.model")
        for i in range(len(ranks), len(ranks) + 256):
            specials.setdefault(f"<|reserved_token_{i}|>", i)
        enc = tiktoken.Encoding(
            "ref",
            pat_str=TIKTOKEN_FAMILIES["tokenization_kimi"].pattern,
            mergeable_ranks=ranks,
            special_tokens=specials,
        )
        return enc.encode(text, allowed_special="all")
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(d))
    return list(
        tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )
    )


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_prompt_ids_equal_the_reference(folders, layout, conversation):
    d = folders[layout]
    messages, tools, kwargs = CONVERSATIONS[conversation]
    front = load_frontend(load_tokenizer(d), d)
    ours = front.renderer.render(messages, tools, kwargs=kwargs).token_ids
    assert ours == reference_ids(layout, d, messages, tools, kwargs)


def test_each_layout_reads_its_family_from_its_files(folders):
    fronts = {n: load_frontend(load_tokenizer(d), d).describe() for n, d in folders.items()}
    assert (
        fronts["kimi"]["tokenizer"] == "TiktokenTokenizer" and fronts["kimi"]["tool_call_parser"] == "kimi_k2"
    )
    assert fronts["deepseek"]["tool_call_parser"] == "deepseek_v31"
    assert fronts["deepseek"]["chat_template"].endswith("tokenizer_config.json")
    assert fronts["qwen"]["tool_call_parser"] == "hermes" and fronts["qwen"]["reasoning_parser"] == "think"
    kimi = load_tokenizer(folders["kimi"])
    assert kimi.eos_token_ids == (kimi.token_id("<|im_end|>"), kimi.token_id("[EOS]"))
    assert kimi.bos_token_id == kimi.token_id("[BOS]")
    qwen = load_tokenizer(folders["qwen"])
    assert not qwen.is_special(qwen.token_id("<tool_call>"))  # an added token that is plain text


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_user_text_never_becomes_a_special_token(folders, layout):
    tok = load_tokenizer(folders[layout])
    front = load_frontend(tok, folders[layout])
    forged = "".join(sorted(tok.special_tokens)[:3])
    ids = front.renderer.render([{"role": "user", "content": f"x {forged} y"}]).token_ids
    clean = front.renderer.render([{"role": "user", "content": "x y"}]).token_ids
    specials = [t for t in ids if tok.is_special(t)]
    assert specials == [t for t in clean if tok.is_special(t)]  # only the template's own
    assert tok.decode(ids).count(forged) == 1


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_streaming_detokenization_equals_decode(folders, layout):
    from inference.tokenizer import make_detokenizer

    tok = load_tokenizer(folders[layout])
    text = "Ünïcödé 東京 🙂 <think>x</think> 17 * 23\n"
    ids = tok.encode(text, allow_special=True)
    d = make_detokenizer(tok)
    assert "".join(d.push([i]) for i in ids) + d.flush() == tok.decode(ids) == text


def test_refusals_name_the_file_and_what_to_do(tmp_path, folders):
    with pytest.raises(TokenizerFilesError, match=r"no tokenizer; a checkpoint folder needs tokenizer.json"):
        load_tokenizer(tmp_path)
    d = checkpoints.kimi_layout(tmp_path / "unknown-family")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": ["tokenization_other.Tok", None]}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TokenizerFilesError, match=r"pre-tokenizer pattern.*pat_str"):
        load_tokenizer(d)
    (d / "chat_template.jinja").unlink()
    cfg["pat_str"] = TIKTOKEN_FAMILIES["tokenization_kimi"].pattern
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TokenizerFilesError, match=r"no chat template.*--chat-template"):
        load_chat_template(d)
    (d / "chat_template.jinja").write_text("{{ raise_exception('this template needs a system message') }}")
    with pytest.raises(TokenizerFilesError, match=r"chat_template.jinja: the chat template cannot render"):
        load_frontend(load_tokenizer(d), d)


def test_a_vocabulary_larger_than_the_embedding_is_refused(tmp_path):
    from inference.engine.factory import build_engine

    d = checkpoints.add_weights(checkpoints.qwen_layout(tmp_path / "q"), vocab_size=256)
    with pytest.raises(
        TokenizerFilesError, match=r"tokenizer has .* ids but .*config.json gives the embedding only 256"
    ):
        build_engine(model_dir=d)


@pytest.fixture(scope="module")
def served(folders):
    import torch

    from inference.embedded import EMBEDDED_ENGINE_CONFIG
    from inference.engine.factory import build_engine
    from inference.server.serve import BackgroundServer

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    servers = {}
    cfg = EMBEDDED_ENGINE_CONFIG.evolve(
        block_size=16, checkpoint_interval=1024, max_model_len=4096, num_blocks=512
    )
    try:
        for name, d in folders.items():
            vocab = load_tokenizer(d).vocab_size
            checkpoints.add_weights(d, vocab_size=vocab + (-vocab) % 64)
            servers[name] = BackgroundServer(
                build_engine(model_dir=d, engine_config=cfg), model_name=name
            ).__enter__()
        with httpx.Client(timeout=120) as client:
            yield servers, client
    finally:
        for s in servers.values():
            s.__exit__(None, None, None)
        torch.set_num_threads(n)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_served_prompt_tokens_and_tokenize_equal_the_reference(served, folders, layout):
    servers, client = served
    url = servers[layout].url
    for messages, tools, kwargs in CONVERSATIONS.values():
        want = reference_ids(layout, folders[layout], messages, tools, kwargs)
        body = {"messages": messages, **({"tools": tools} if tools else {}), "chat_template_kwargs": kwargs}
        got = client.post(f"{url}/tokenize", json=body).json()
        assert got["tokens"] == want and got["count"] == len(want)
        r = client.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(want)
        msg = r.json()["choices"][0]["message"]
        assert not any(
            t in (msg.get("content") or "") for t in load_tokenizer(folders[layout]).special_tokens
        )
    text = "Ünïcödé 🙂 and 17 * 23"
    ids = client.post(f"{url}/tokenize", json={"prompt": text}).json()["tokens"]
    assert client.post(f"{url}/detokenize", json={"tokens": ids}).json()["prompt"] == text


def test_prefix_reuse_on_a_jinja_templated_checkpoint(served):
    """The three reuse cases: the same request again, a shared system prompt, the next turn."""
    servers, client = served
    url = servers["qwen"].url

    def ask(messages):
        r = client.post(
            f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0}
        )
        assert r.status_code == 200, r.text
        return r.json()

    system = {"role": "system", "content": "You answer in one word. " * 60}
    first = [system, {"role": "user", "content": "Colour of the sky?"}]
    a = ask(first)
    again = ask(first)
    n = a["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= n - 16
    other = ask([system, {"role": "user", "content": "Colour of grass?"}])
    system_len = len(
        client.post(f"{url}/tokenize", json={"messages": [system], "add_generation_prompt": False}).json()[
            "tokens"
        ]
    )
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] >= system_len - 1
    follow = [*first, a["choices"][0]["message"], {"role": "user", "content": "And at night?"}]
    nxt = ask(follow)
    assert nxt["usage"]["prompt_tokens_details"]["cached_tokens"] >= n
