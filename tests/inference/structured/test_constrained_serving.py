"""Every corpus schema answered validly by construction, through `dayzero infer serve` and the
official `openai` SDK: the bundled demo model and a random-weight `--dummy` model take turns, each
schema asked once (as `response_format`, a required tool or a named tool, whole or streamed, in
rotation; `benchmarks/structured_outputs.py` runs the whole matrix). A schema the grammar cannot
express is a 400 naming the keyword, never a silently unconstrained answer."""

from __future__ import annotations

import json

import httpx
import pytest

from inference.demo_model.spec import DEMO_DIR
from inference.structured.grammar import describes_object, schema_error, with_options
from testing.inference_server import served
from testing.structured import conformance
from testing.structured.corpus import SUPPORT_FILE, load_corpus, load_unsupported

pytestmark = pytest.mark.slow

CORPUS = load_corpus()


def _refused(schema: dict) -> bool:
    """What the server's own check refuses (llguidance with the server's JSON options)."""
    return schema_error(json.dumps(with_options(schema), sort_keys=True)) is not None


REFUSED = {e.name for e in CORPUS if _refused(e.schema)}
SUPPORTED = [e for e in CORPUS if e.name not in REFUSED]


@pytest.fixture(scope="module")
def servers():
    with (
        served(["--dummy", "--max-num-seqs", "16"]) as dummy,
        served(["--model", str(DEMO_DIR), "--max-num-seqs", "16"]) as demo,
    ):
        yield {"dayzero-small-random": dummy, "dayzero-demo": demo}


def rotation() -> dict[str, list[conformance.Case]]:
    plan: dict[str, list[conformance.Case]] = {"dayzero-small-random": [], "dayzero-demo": []}
    for i, entry in enumerate(SUPPORTED):
        model = ("dayzero-small-random", "dayzero-demo")[i % 2]
        mode = (
            conformance.MODES[(i // 2) % 3] if conformance.tool_mode_fits(entry.schema) else "response_format"
        )
        plan[model].append(conformance.Case(entry, mode, stream=(i // 6) % 2 == 1))
    for i, entry in enumerate(SUPPORTED[:8]):
        plan[("dayzero-small-random", "dayzero-demo")[i % 2]].append(
            conformance.Case(entry, "json_object", i % 4 < 2)
        )
    return plan


def test_every_supported_schema_is_answered_validly(servers):
    """Every answer that ended by itself validates; an answer cut at max_tokens (finish_reason
    `length`, which the budget rule makes rare) is the only exception, as for any API."""
    outcomes = [
        o for model, cases in rotation().items() for o in conformance.run(servers[model], model, cases)
    ]
    assert len(outcomes) == len(SUPPORTED) + 8
    bad = [
        (o.case.entry.name, o.case.mode, o.case.stream, o.finish_reason, o.error) for o in outcomes if o.error
    ]
    invalid = [b for b in bad if b[3] != "length"]
    assert not invalid, f"{len(invalid)} of {len(outcomes)} finished answers invalid: {invalid[:10]}"
    cut = [b for b in bad if b[3] == "length"]
    assert len(cut) <= 0.12 * len(outcomes), (
        f"{len(cut)} of {len(outcomes)} answers ran out of max_tokens: {cut[:10]}"
    )


def test_a_schema_the_grammar_cannot_express_is_refused_by_keyword(servers):
    url = servers["dayzero-small-random"]
    refused = [e for e in CORPUS if e.name in REFUSED]
    support = json.loads(SUPPORT_FILE.read_text())
    assert refused and {n for n, s in support.items() if not s["compiles"]} >= REFUSED
    cases = [(e.schema, support[e.name]["error"].split("\n")[0][:40]) for e in refused]
    # the unsupported corpus, as far as the server's own check refuses it (with the server's JSON
    # options llguidance accepts two of its oneOf schemas: 017 and 018)
    unsupported = [(u.schema, u.error_contains) for u in load_unsupported() if _refused(u.schema)]
    assert len(unsupported) >= 23
    cases += unsupported
    for schema, needle in cases:
        bodies = [
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema, "strict": True},
                }
            }
        ]
        if describes_object(schema):  # other roots are refused as tool parameters for that reason
            tool = {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}
            bodies.append({"tools": [tool], "tool_choice": "required"})
        for body in bodies:
            r = httpx.post(
                f"{url}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **body},
                timeout=60,
            )
            assert r.status_code == 400, (needle, r.text)
            assert needle in r.json()["error"]["message"], (needle, r.text)
    # a tool that is not strict is still called, its arguments then any JSON object
    schema = refused[0].schema
    body = {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
        "tool_choice": "required",
    }
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 64, **body},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    call = r.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "f" and isinstance(json.loads(call["function"]["arguments"]), dict)
