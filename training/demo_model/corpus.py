"""The synthetic agent corpus the demo model is trained (and evaluated) on.

Every sample is one conversation in OpenAI message form with the tools list the runner sends
(`ToolRegistry.openai_tools()` of the default registry, so the trained prompt is the deployed one).
Tool results are produced by running the real built-in tools (`calculator`, `search_documents`,
`image_info` on real generated image files), and rendered as the runner renders them
(`tool_result_text`), so the model learns the exact bytes it will read at run time.

Sample `i` of a split is drawn from its own `random.Random(split_seed + i)`: the corpus is the same
on any machine, in any process order, and the eval split never shares a seed with training.

Categories (`CATEGORIES`): `calc` (one calculator call), `calc_multi` (two or three chained calls),
`calc_word` (word problems), `search` (search_documents over attached text), `image_info`,
`plain` (greetings, identity, refusals: no tool), `followup` (a second user turn on the first's
result). A `Task` keeps what the eval needs to judge the model's own run of it.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from inference.demo_model.spec import EVAL_SEED, TRAIN_SEED  # noqa: F401 (TRAIN_SEED: re-exported)

CATEGORIES: tuple[str, ...] = ("calc", "calc_multi", "calc_word", "search", "image_info", "plain", "followup")
# training mix (weights), chosen so the hardest categories get the most samples
CATEGORY_WEIGHTS: dict[str, float] = {
    "calc": 0.15,
    "calc_multi": 0.18,
    "calc_word": 0.12,
    "search": 0.22,
    "image_info": 0.12,
    "plain": 0.07,
    "followup": 0.14,
}

GREETING = (
    "Hello! I can do exact arithmetic with the calculator, search your attached documents and "
    "read the size and format of attached images. What would you like to do?"
)
IDENTITY = (
    "I am dayzero's small demo model: a tiny hybrid KDA/MLA mixture-of-experts model trained to "
    "use the calculator, search_documents and image_info tools."
)
REFUSAL = (
    "I can't help with that: my tools only do exact arithmetic, search attached documents and "
    "read image information."
)
THANKS = "You're welcome!"


@dataclass
class Turn:
    """One user turn and what a correct agent must end it with."""

    user: str
    expected: str  # the final answer text a correct run produces (exact, as trained)
    needles: tuple[str, ...] = ()  # strings the final answer must contain to count as correct


@dataclass
class Task:
    category: str
    turns: list[Turn]
    attachments: list[dict[str, Any]] = field(default_factory=list)  # Attachment fields
    messages: list[dict[str, Any]] = field(default_factory=list)  # the full reference conversation


def tool_result_text(content: Any) -> str:
    """A tool result as the model reads it (the runner's rendering: JSON, non-ASCII kept)."""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)


class ToolBox:
    """The default tool registry plus a scratch folder for generated image files."""

    def __init__(self, workdir: str | Path | None = None) -> None:
        from tools.base import ToolContext  # noqa: F401  (fail early if tools are missing)
        from workers.tool_jobs import build_registry

        self.registry = build_registry()
        self.tools = self.registry.openai_tools(None)
        self.tool_names = set(self.registry.names())
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="dayzero-demo-")
            workdir = self._tmp.name
        self.workdir = Path(workdir)

    def context(self, attachments: Sequence[Mapping[str, Any]]) -> Any:
        from tools.base import Attachment, ToolContext

        atts = tuple(
            Attachment(
                id=a["id"],
                media_type=a["media_type"],
                path=Path(a["path"]) if a.get("path") else None,
                text=a.get("text"),
            )
            for a in attachments
        )
        return ToolContext("demo", "0", 1, "demo:0:1", attachments=atts)

    def run(self, name: str, arguments: str, attachments: Sequence[Mapping[str, Any]]) -> str:
        """Run one call as the runner does; a tool error becomes the error object the model reads."""
        from tools.base import ToolError

        try:
            return tool_result_text(self.registry.execute(name, arguments, self.context(attachments)).content)
        except ToolError as exc:
            return tool_result_text({"error": str(exc), "kind": exc.kind.value})


# -- building conversations -----------------------------------------------------------------------


class _Conv:
    """Accumulates messages; `call` runs the real tool and appends call + result."""

    def __init__(self, box: ToolBox, attachments: list[dict[str, Any]]) -> None:
        self.box, self.attachments = box, attachments
        self.messages: list[dict[str, Any]] = []
        self.num_calls = 0

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def call(self, name: str, args: dict[str, Any]) -> Any:
        call_id = f"functions.{name}:{self.num_calls}"
        self.num_calls += 1
        raw = json.dumps(args, ensure_ascii=False, separators=(", ", ": "))
        self.messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}
                ],
            }
        )
        result = self.box.run(name, raw, self.attachments)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        return json.loads(result)

    def answer(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})


def _shown(content: Mapping[str, Any]) -> str:
    """How an answer states a calculator value: the integer, else its (short, exact) decimal."""
    return content["value"] if content.get("is_integer") else content["decimal"]


def _terminating(x: Fraction, max_places: int = 4) -> bool:
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d != 1:
        return False
    return (x * 10**max_places).denominator == 1


_CALC_Q = (
    "What is {e}?", "what is {e}", "Compute {e}.", "Calculate {e}", "What's {e}?", "Please work out {e}.",
    "{e} = ?", "How much is {e}?", "Evaluate {e}.", "Can you calculate {e} for me?",
)  # fmt: skip


def _number(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.25:
        return str(rng.randint(1, 99))
    if r < 0.85:
        return str(rng.randint(10, 9999))
    if r < 0.95:
        return str(rng.randint(1000, 999999))
    return f"{rng.randint(0, 99)}.{rng.randint(1, 99)}"


def _expression(rng: random.Random) -> str:
    """2-4 operands with + - * (and an exact /), spaces as people type them, optional parentheses."""
    while True:
        n = rng.choices((2, 3, 4), (0.5, 0.35, 0.15))[0]
        nums = [_number(rng) for _ in range(n)]
        ops = [rng.choice("+-**+-/") for _ in range(n - 1)]
        spaced = rng.random() < 0.6
        parts = [nums[0]]
        for op, x in zip(ops, nums[1:], strict=True):
            parts.append(f" {op} " if spaced else op)
            parts.append(x)
        e = "".join(parts)
        if n >= 3 and rng.random() < 0.3:  # parenthesise the first two operands
            k = len(nums[0]) + len(parts[1]) + len(nums[1])
            e = "(" + e[:k] + ")" + e[k:]
        from tools.builtin.calculator import CalculatorError, evaluate

        try:
            val = evaluate(e)
        except (CalculatorError, ZeroDivisionError):
            continue
        if "/" in e and not _terminating(val):
            continue
        if abs(val) < 10**15:
            return e


def _calc(c: _Conv, rng: random.Random) -> list[Turn]:
    e = _expression(rng)
    c.user(rng.choice(_CALC_Q).format(e=e))
    v = _shown(c.call("calculator", {"expression": e}))
    text = f"{e} = {v}."
    c.answer(text)
    return [Turn(c.messages[0]["content"], text, (v,))]


_STEP1 = (
    ("multiply {a} by {b}", "{a}*{b}"),
    ("add {a} and {b}", "{a} + {b}"),
    ("subtract {b} from {a}", "{a} - {b}"),
    ("compute {a} times {b}", "{a}*{b}"),
    ("take the sum of {a} and {b}", "{a} + {b}"),
)
_STEP2 = (
    ("add {c} to the result", "{r} + {c}"),
    ("subtract {c} from it", "{r} - {c}"),
    ("multiply the result by {c}", "{r}*{c}"),
    ("multiply that by {c}", "{r}*{c}"),
    ("add {c}", "{r} + {c}"),
)
_MULTI_Q = (
    "First {s1}, then {s2}.", "{S1}, then {s2}.", "Please {s1} and then {s2}.",
    "Step by step: {s1}, then {s2}. What do you get?",
)  # fmt: skip


def _calc_multi(c: _Conv, rng: random.Random) -> list[Turn]:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    d1, e1 = rng.choice(_STEP1)
    steps = [rng.choice(_STEP2) for _ in range(rng.choices((1, 2), (0.7, 0.3))[0])]
    cs = [rng.randint(2, 999) for _ in steps]
    s2 = ", then ".join(d.format(c=x) for (d, _), x in zip(steps, cs, strict=True))
    s1 = d1.format(a=a, b=b)
    q = rng.choice(_MULTI_Q).format(s1=s1, S1=s1[0].upper() + s1[1:], s2=s2)
    c.user(q)
    expr = e1.format(a=a, b=b)
    r = _shown(c.call("calculator", {"expression": expr}))
    for (_, e2), x in zip(steps, cs, strict=True):
        expr = e2.format(r=r, c=x)
        r = _shown(c.call("calculator", {"expression": expr}))
    # the calls show the steps; the answer copies the last result (a recap of every step was
    # where the small model slipped)
    text = f"The answer is {r}."
    c.answer(text)
    return [Turn(q, text, (r,))]


_NAMES = ("Anna", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Keiko", "Liam")
# (question template, expression template, answer template, number ranges a, b, c)
_WORD: tuple[tuple[str, str, str], ...] = (
    ("{n} buys {a} boxes with {b} pencils each and gives away {c} pencils. How many pencils are left?",
     "{a}*{b} - {c}", "{n} has {r} pencils left."),
    ("A train travels {a} km per hour for {b} hours. How far does it go?", "{a}*{b}", "It travels {r} km."),
    ("{n} has {a} euros, spends {b} euros on books and {c} euros on lunch. How much money is left?",
     "{a} - {b} - {c}", "{r} euros are left."),
    ("A shop sells {a} apples on Monday and {b} on Tuesday. Each apple costs {c} cents. How many cents "
     "did the shop earn?", "({a} + {b})*{c}", "The shop earned {r} cents."),
    ("A rectangle is {a} m long and {b} m wide. What is its area?", "{a}*{b}",
     "The area is {r} square metres."),
    ("{n} saves {a} dollars a week for {b} weeks. How much does {n} save?", "{a}*{b}",
     "{n} saves {r} dollars."),
    ("A factory makes {a} cars a day for {b} days, and {c} of them are rejected. How many good cars "
     "does it make?", "{a}*{b} - {c}", "It makes {r} good cars."),
    ("A library has {a} books and buys {b} more, then lends out {c}. How many books are on the shelves?",
     "{a} + {b} - {c}", "There are {r} books on the shelves."),
    ("{n} reads {a} pages a day. How many pages does {n} read in {b} days?", "{a}*{b}",
     "{n} reads {r} pages."),
    ("Tickets cost {a} dollars each. How much do {b} tickets cost?", "{a}*{b}",
     "{b} tickets cost {r} dollars."),
)  # fmt: skip


def _calc_word(c: _Conv, rng: random.Random) -> list[Turn]:
    q_t, e_t, a_t = rng.choice(_WORD)
    while True:
        a, b, cc = rng.randint(2, 999), rng.randint(2, 99), rng.randint(1, 999)
        if "- {b} - {c}" in e_t and a < b + cc:
            continue
        if "*{b} - {c}" in e_t and a * b < cc:
            continue
        if "+ {b} - {c}" in e_t and a + b < cc:
            continue
        break
    n = rng.choice(_NAMES)
    q = q_t.format(n=n, a=a, b=b, c=cc)
    c.user(q)
    expr = e_t.format(a=a, b=b, c=cc)
    r = _shown(c.call("calculator", {"expression": expr}))
    text = a_t.format(n=n, b=b, r=r)
    c.answer(text)
    return [Turn(q, text, (r,))]


_SYL = ("ka", "lo", "mi", "ra", "ve", "to", "sen", "dor", "il", "an", "bru", "qua", "zel", "fin", "or", "tas")
# (attribute, sentence, value kind): the passage states each fact in the very sentence the answer
# is, so answering is copying one sentence of the tool result verbatim (a copy a small model learns;
# "Its capital is X." in the passage, answered as "The capital of E is X.", was not learnt)
_ATTRS = (
    ("capital", "The capital of {e} is {v}.", "word"),
    ("population", "The population of {e} is {v}.", "int"),
    ("founded", "{e} was founded in {v}.", "year"),
    ("export", "The main export of {e} is {v}.", "good"),
    ("river", "The longest river of {e} is the {v}.", "word"),
    ("currency", "The currency of {e} is the {v}.", "word"),
)
_ATTR_Q = {
    "capital": ("What is the capital of {e}?", "capital of {e}"),
    "population": ("What is the population of {e}?", "population of {e}"),
    "founded": ("When was {e} founded?", "{e} founded"),
    "export": ("What is the main export of {e}?", "main export of {e}"),
    "river": ("What is the longest river of {e}?", "longest river of {e}"),
    "currency": ("What is the currency of {e}?", "currency of {e}"),
}
_GOODS = (
    "copper",
    "wool",
    "tea",
    "salt",
    "timber",
    "glass",
    "coffee",
    "silk",
    "olives",
    "tin",
    "rice",
    "paper",
)
_Q_PREFIX = (
    "",
    "According to the attached document, ",
    "Using the attached notes: ",
    "Search the documents. ",
)


def _word(rng: random.Random, syl: int = 2) -> str:
    return "".join(rng.choice(_SYL) for _ in range(syl)).capitalize()


def _fact_value(rng: random.Random, kind: str) -> str:
    if kind == "int":
        return str(rng.randint(1000, 9_999_999))
    if kind == "year":
        return str(rng.randint(900, 1999))
    if kind == "good":
        return rng.choice(_GOODS)
    return _word(rng, rng.choice((2, 3)))


def _document(rng: random.Random, entity: str) -> tuple[str, dict[str, str]]:
    attrs = rng.sample(_ATTRS, k=rng.randint(3, 4))
    facts = {name: _fact_value(rng, kind) for name, _, kind in attrs}
    text = f"{entity} is a country. " + " ".join(
        sent.format(e=entity, v=facts[name]) for name, sent, _ in attrs
    )
    return text, facts


def _search(c: _Conv, rng: random.Random) -> list[Turn]:
    entities = list(dict.fromkeys(_word(rng, rng.choice((2, 3))) for _ in range(rng.choice((1, 2)))))
    answers: dict[str, tuple[str, dict[str, str]]] = {}
    for i, e in enumerate(entities):
        text, facts = _document(rng, e)
        c.attachments.append(
            {"id": f"doc-{rng.randrange(16**6):06x}", "media_type": "text/plain", "text": text}
        )
        answers[e] = (text, facts)
        del i
    e = rng.choice(entities)
    name = rng.choice(list(answers[e][1]))
    q_t, query_t = _ATTR_Q[name]
    prefix = rng.choice(_Q_PREFIX)
    q = prefix + (q_t[0].lower() + q_t[1:] if prefix.endswith(", ") else q_t).format(e=e)
    c.user(q)
    result = c.call("search_documents", {"query": query_t.format(e=e)})
    del result  # the answer is in the top snippet (documents are shorter than a snippet)
    v = answers[e][1][name]
    answer_t = next(a for n, a, _ in _ATTRS if n == name)
    text = answer_t.format(e=e, v=v)
    c.answer(text)
    return [Turn(q, text, (v,))]


_IMG_Q = (
    ("What is the size of image {i}?", "size"), ("How big is the attached image {i}?", "size"),
    ("What are the dimensions of {i}?", "size"), ("How wide is image {i}?", "width"),
    ("How tall is image {i}?", "height"), ("What format is image {i}?", "format"),
    ("What is the file format of the attached image {i}?", "format"),
)  # fmt: skip
_IMG_FORMATS = (("PNG", "png", "image/png"), ("JPEG", "jpg", "image/jpeg"), ("GIF", "gif", "image/gif"))


def _image_info(c: _Conv, rng: random.Random) -> list[Turn]:
    from PIL import Image

    fmt, ext, media = rng.choice(_IMG_FORMATS)
    w, h = rng.randint(8, 1600), rng.randint(8, 1200)
    att_id = f"img-{rng.randrange(16**6):06x}"
    path = c.box.workdir / f"{att_id}.{ext}"
    colour = tuple(rng.randrange(256) for _ in range(3))
    Image.new("RGB", (w, h), colour).save(path, format=fmt)
    c.attachments.append({"id": att_id, "media_type": media, "path": str(path)})
    q_t, kind = rng.choice(_IMG_Q)
    q = q_t.format(i=att_id)
    c.user(q)
    info = c.call("image_info", {"attachment_id": att_id})
    w, h, f = info["width"], info["height"], info["format"]
    # one answer for every question kind, holding all three facts: the model only copies numbers
    # from the tool result (choosing among four templates by the question was often got wrong)
    text = f"It is a {f} image, {w} pixels wide and {h} pixels tall."
    needles = {
        "size": (f"{w} pixels wide", f"{h} pixels tall"),
        "width": (f"{w} pixels wide",),
        "height": (f"{h} pixels tall",),
        "format": (f"a {f} image",),
    }[kind]
    c.answer(text)
    return [Turn(q, text, needles)]


_PLAIN = (
    (("Hi", "Hello!", "hello", "Good morning", "Hey there", "Hi, what can you do?", "What can you do?"), GREETING),
    (("Who are you?", "What are you?", "Which model are you?", "Tell me about yourself."), IDENTITY),
    (("What's the weather in Paris today?", "Send an email to my boss.", "Book me a flight to Rome.",
      "What is the latest news?", "What is the price of Bitcoin right now?", "Play some music.",
      "Order a pizza for me.", "Write me a poem about the sea.", "Translate this into French: good night.",
      "Who won the football match yesterday?", "Set an alarm for 7 am."), REFUSAL),
    (("Thanks!", "Thank you.", "thanks a lot", "Great, thank you!"), THANKS),
)  # fmt: skip


def _plain(c: _Conv, rng: random.Random) -> list[Turn]:
    qs, reply = rng.choice(_PLAIN)
    q = rng.choice(qs)
    c.user(q)
    c.answer(reply)
    return [Turn(q, reply)]


_FOLLOW = (
    ("Now multiply that by {x}.", "{r}*{x}"), ("And add {x} to that?", "{r} + {x}"),
    ("Subtract {x} from it.", "{r} - {x}"), ("What is that times {x}?", "{r}*{x}"),
    ("Add {x} to the result.", "{r} + {x}"),
)  # fmt: skip


def _followup(c: _Conv, rng: random.Random) -> list[Turn]:
    first = (_calc if rng.random() < 0.6 else _calc_word)(c, rng)
    r = first[0].needles[0]
    if rng.random() < 0.15:
        q = rng.choice(_PLAIN[3][0])
        c.user(q)
        c.answer(THANKS)
        return [first[0], Turn(q, THANKS)]
    q_t, e_t = rng.choice(_FOLLOW)
    x = rng.randint(2, 999)
    q = q_t.format(x=x)
    c.user(q)
    expr = e_t.format(r=r, x=x)
    v = _shown(c.call("calculator", {"expression": expr}))
    text = f"{expr} = {v}."
    c.answer(text)
    return [first[0], Turn(q, text, (v,))]


_MAKERS = {
    "calc": _calc,
    "calc_multi": _calc_multi,
    "calc_word": _calc_word,
    "search": _search,
    "image_info": _image_info,
    "plain": _plain,
    "followup": _followup,
}


def make_task(box: ToolBox, seed: int, category: str | None = None) -> Task:
    """One conversation from its own seed (category drawn by `CATEGORY_WEIGHTS` unless given)."""
    rng = random.Random(seed)
    if category is None:
        category = rng.choices(list(CATEGORY_WEIGHTS), list(CATEGORY_WEIGHTS.values()))[0]
    elif category not in _MAKERS:
        raise ValueError(f"unknown category {category!r}; known: {', '.join(CATEGORIES)}")
    c = _Conv(box, [])
    turns = _MAKERS[category](c, rng)
    return Task(category, turns, c.attachments, c.messages)


def eval_tasks(box: ToolBox, per_category: int) -> list[Task]:
    """The held-out set: `per_category` tasks of each category from the eval seed range."""
    return [
        make_task(box, EVAL_SEED + 1000 * ci + i, cat)
        for ci, cat in enumerate(CATEGORIES)
        for i in range(per_category)
    ]
