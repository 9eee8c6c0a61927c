"""Arithmetic families: expressions (symbols, locales, long numbers), number words, word problems
and multi-step instructions. Each task is one calculator call on the canonical expression, then
the value in one sentence in the question's language.

A structure (what is computed) is phrased by several templates: most train, one or two are held
out, so the eval asks for known skills in words the model never saw.
"""

from __future__ import annotations

import random

from tools.builtin.calculator import CalculatorError, evaluate
from training.demo_model.corpus.base import Conv, Family, Turn
from training.demo_model.corpus.numbers import digits, localise, number_words, operand

__all__ = ["ANSWER", "FAMILIES", "answer_with_calculator"]

ANSWER = {
    "en": "The answer is {v}.",
    "fr": "Le résultat est {v}.",
    "de": "Das Ergebnis ist {v}.",
    "es": "El resultado es {v}.",
}


def answer_with_calculator(c: Conv, question: str, expression: str, lang: str = "en") -> Turn:
    """The user asks `question`; the model calls the calculator on `expression` and states the value."""
    c.user(question)
    out = c.call("calculator", {"expression": expression})
    v = out["value"] if out.get("is_integer") else out["decimal"]
    text = ANSWER[lang].format(v=v)
    c.answer(text)
    return Turn(question, text, (v,), tool="calculator")


def _valid(e: str) -> bool:
    try:
        v = evaluate(e)
    except (CalculatorError, ZeroDivisionError):
        return False
    d = v.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1 and abs(v) < 10**15 and (v * 10**4).denominator == 1


# -- expressions -------------------------------------------------------------------------------

# operator -> how each language's question may write it
_SYMBOLS = {"+": ("+",), "-": ("-", "−"), "*": ("*", "×", "x"), "/": ("/", "÷")}


def _expression(rng: random.Random, locale: str) -> tuple[str, str]:
    """(canonical expression, the question's rendering of it)."""
    while True:
        n = rng.choices((2, 3, 4), (0.55, 0.33, 0.12))[0]
        nums = [operand(rng) for _ in range(n)]
        ops = [rng.choice("+-**+-/") for _ in range(n - 1)]
        paren = n >= 3 and rng.random() < 0.3
        spaced = rng.random() < 0.7
        fancy = rng.random() < 0.4
        canon, shown = [nums[0]], [localise(nums[0], locale, group=rng.random() < 0.5)]
        for op, x in zip(ops, nums[1:], strict=True):
            canon += [f" {op} " if spaced else op, x]
            sym = rng.choice(_SYMBOLS[op]) if fancy else op
            shown += [
                f" {sym} " if spaced or sym == "x" else sym,
                localise(x, locale, group=rng.random() < 0.5),
            ]
        if paren:
            canon = ["(", *canon[:3], ")", *canon[3:]]
            shown = ["(", *shown[:3], ")", *shown[3:]]
        e = "".join(canon)
        if _valid(e):
            return e, "".join(shown)


_CALC_TRAIN = {
    "en": ("What is {e}?", "what is {e}", "Compute {e}.", "Calculate {e}", "What's {e}?", "{e} = ?",
           "How much is {e}?", "Evaluate {e}.", "Can you calculate {e} for me?", "Work out {e}.",
           "Please compute {e}", "{e}", "Could you compute {e}?", "Tell me what {e} is.",
           "I need the value of {e}.", "What does {e} come to?", "Quick question: what is {e}?"),
    "fr": ("Combien font {e} ?", "Calcule {e}.", "Combien fait {e} ?", "Quel est le résultat de {e} ?",
           "Tu peux calculer {e} ?", "Que vaut {e} ?"),
    "de": ("Was ist {e}?", "Wie viel ist {e}?", "Berechne {e}.", "Rechne {e} aus.", "Was ergibt {e}?",
           "Kannst du {e} berechnen?", "Bitte {e} ausrechnen."),
    "es": ("¿Cuánto es {e}?", "Calcula {e}.", "¿Cuál es el resultado de {e}?", "Resuelve {e}.",
           "¿Qué da {e}?", "¿Puedes calcular {e}?", "Calcúlame {e}."),
}  # fmt: skip
_CALC_HELD = {
    "en": ("Please calculate {e}.", "Could you tell me what {e} comes to?", "I need {e} worked out.",
           "Quick one: {e}?"),
    "fr": ("Peux-tu calculer {e} ?", "Combien vaut {e} ?"),
    "de": ("Wie viel ergibt {e}?", "Kannst du {e} ausrechnen?"),
    "es": ("¿Me calculas {e}?", "¿Cuánto da {e}?"),
}  # fmt: skip


def _calc(templates: dict[str, tuple[str, ...]]):
    def make(c: Conv, rng: random.Random) -> Turn:
        lang = rng.choices(("en", "fr", "de", "es"), (0.55, 0.15, 0.15, 0.15))[0]
        e, shown = _expression(rng, lang)
        return answer_with_calculator(c, rng.choice(templates[lang]).format(e=shown), e, lang)

    return make


def _calc_recover(c: Conv, rng: random.Random) -> Turn:
    """A first call the calculator rejects (a × sign or a grouped number copied as it is), its
    error, then the corrected call: the model learns the recovery, not the mistake."""
    e, shown = _expression(rng, "en")
    q = rng.choice(_CALC_TRAIN["en"]).format(e=shown)
    bad = shown if shown != e else e.replace("*", "×", 1) if "*" in e else e + " +"
    c.user(q)
    c.call("calculator", {"expression": bad}, learn=False)
    out = c.call("calculator", {"expression": e})
    v = out["value"] if out.get("is_integer") else out["decimal"]
    text = ANSWER["en"].format(v=v)
    c.answer(text)
    return Turn(q, text, (v,), tool="calculator")


# -- number words --------------------------------------------------------------------------------

_WORD_OPS = {  # op -> (train templates, held-out templates)
    "*": (("Multiply {a} by {b}.", "What is {a} times {b}?", "Compute {a} multiplied by {b}.",
           "What do you get if you multiply {a} by {b}?", "How much is {a} times {b}?",
           "{A} times {b} is how much?", "Find the product of {a} and {b}."),
          ("Multiply {a} by {b}, please.", "What's the product of {a} and {b}?")),
    "+": (("Add {a} and {b}.", "What is {a} plus {b}?", "What is the sum of {a} and {b}?",
           "How much is {a} plus {b}?", "Add {a} to {b}.", "{A} plus {b} equals?",
           "Put {a} and {b} together: what is the total?"),
          ("Please add {a} and {b} together.", "{A} plus {b} makes what?")),
    "-": (("Subtract {b} from {a}.", "What is {a} minus {b}?", "Take {b} away from {a}.",
           "How much is {a} minus {b}?", "{A} minus {b} equals?", "Find the difference of {a} and {b}."),
          ("What's the difference between {a} and {b}?", "{A} minus {b}, please.")),
    "/": (("Divide {a} by {b}.", "What is {a} divided by {b}?", "How much is {a} divided by {b}?",
           "{A} divided by {b} equals?", "Divide {a} into {b} equal parts."),
          ("Split {a} into {b} equal parts: how big is each?", "{A} divided by {b} is what?")),
}  # fmt: skip


def _word_operands(rng: random.Random, op: str) -> tuple[int, int]:
    big = rng.random() < 0.3
    a, b = rng.randint(0, 9999 if big else 999), rng.randint(1, 999 if big else 99)
    if op == "/":
        a = b * rng.randint(1, 99)
    if op == "-" and a < b and rng.random() < 0.7:
        a, b = b, a
    return a, b


def _number_words(held: bool):
    def make(c: Conv, rng: random.Random) -> Turn:
        op = rng.choice("*+-/")
        a, b = _word_operands(rng, op)
        use_and = rng.random() < 0.4
        wa, wb = number_words(a, use_and=use_and), number_words(b, use_and=use_and)
        if rng.random() < 0.25:  # one operand in digits
            wa, wb = (str(a), wb) if rng.random() < 0.5 else (wa, str(b))
        t = rng.choice(_WORD_OPS[op][1 if held else 0])
        q = t.format(a=wa, b=wb, A=wa[:1].upper() + wa[1:])
        sym = {"*": "*", "+": "+", "-": "-", "/": "/"}[op]
        return answer_with_calculator(c, q, f"{a} {sym} {b}")

    return make


# -- word problems ---------------------------------------------------------------------------------

_NAMES = ("Anna", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Keiko",
          "Liam", "Maya", "Noor", "Oscar", "Priya", "Quentin", "Rosa", "Sam", "Tariq")  # fmt: skip
_ITEMS = (
    "pencils",
    "apples",
    "books",
    "stickers",
    "cookies",
    "marbles",
    "cards",
    "bottles",
    "eggs",
    "stamps",
)

# structure -> (expression, train templates, held-out templates); {n} a name, {i} an item noun
_STRUCTURES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "rate": ("{a} * {b}", (
        "{n} buys {a} boxes with {b} {i} in each. How many {i} is that?",
        "A train travels {a} km per hour for {b} hours. How far does it go?",
        "{n} reads {a} pages a day. How many pages does {n} read in {b} days?",
        "Tickets cost {a} dollars each. How much do {b} tickets cost?",
        "A farm packs {b} crates of {a} {i}. How many {i} in total?",
        "{n} saves {a} euros a week for {b} weeks. How much is saved?",
        "Each bag holds {a} {i}. How many {i} fit in {b} bags?",
        "A machine prints {a} labels per minute for {b} minutes. How many labels does it print?",
    ), (
        "If one bag holds {a} {i}, how many {i} are in {b} bags?",
        "A printer prints {a} pages every minute. How many pages after {b} minutes?",
    )),
    "spend": ("{a} - {b} - {c}", (
        "{n} has {a} euros, spends {b} euros on books and {c} euros on lunch. How much money is left?",
        "A tank holds {a} litres. {b} litres are used on Monday and {c} on Tuesday. How much is left?",
        "{n} had {a} {i}, gave {b} to a friend and lost {c}. How many are left?",
        "{n} starts with {a} dollars and pays {b} dollars for shoes and {c} dollars for a coat. What is left?",
        "A shop had {a} {i}; {b} were sold and {c} broken. How many remain?",
    ), (
        "Starting with {a} dollars, {n} pays {b} dollars for a coat and {c} dollars for shoes. What remains?",
    )),
    "change": ("{a} - {b} * {c}", (
        "{n} pays with a {a}-dollar note for {b} items costing {c} dollars each. How much change?",
        "{n} has {a} euros and buys {b} tickets at {c} euros each. How much money is left?",
        "A roll of {a} metres of ribbon is cut into {b} pieces of {c} metres. How much ribbon is left?",
        "{n} hands over {a} dollars for {b} sandwiches at {c} dollars apiece. How much comes back?",
        "{n} has {a} dollars in a wallet and buys {b} pens at {c} dollars each. What change is left?",
    ), (
        "I hand over ${a} for {b} sandwiches at ${c} apiece. What change do I get back?",
        "With {a} dollars in my wallet I buy {b} books costing {c} dollars each. How much do I have left?",
    )),
    "group_cost": ("({a} + {b}) * {c}", (
        "A shop sells {a} {i} on Monday and {b} on Tuesday at {c} cents each. How many cents did it earn?",
        "{n} buys {a} red and {b} blue {i}; each costs {c} dollars. What is the total cost?",
        "{a} adults and {b} children see a show, and a ticket costs {c} euros. What do they pay in all?",
    ), (
        "There are {a} adults and {b} children, and every ticket is {c} euros. What do all tickets cost?",
    )),
    "net": ("{a} * {b} - {c}", (
        "A factory makes {a} cars a day for {b} days, and {c} of them are rejected. How many good cars?",
        "{n} buys {a} packs of {b} {i} and gives away {c}. How many {i} are left?",
        "A store has {b} shelves with {a} {i} on each and sells {c} of them. How many remain?",
    ), (
        "{b} shelves hold {a} {i} each, and {c} {i} are sold. How many {i} remain?",
    )),
    "share": ("{a} / {b}", (
        "{n} shares {a} {i} equally among {b} friends. How many does each friend get?",
        "A rope of {a} metres is cut into {b} equal pieces. How long is each piece?",
        "{a} euros are split evenly between {b} people. How much does each person get?",
        "{a} {i} are divided fairly among {b} kids. How many does each kid get?",
    ), (
        "How many {i} does each of {b} kids get if {a} {i} are divided fairly?",
    )),
    "sum": ("{a} + {b} + {c}", (
        "{n} walks {a} metres, then {b} metres, then {c} metres. How far in total?",
        "A library has {a} novels, {b} atlases and {c} comics. How many books altogether?",
        "A bag weighs {a} grams, a box {b} grams and a jar {c} grams. What is their total weight?",
    ), (
        "Three boxes weigh {a}, {b} and {c} grams. What is their combined weight?",
    )),
    "more": ("{a} - {b}", (
        "{n} has {a} {i} and a friend has {b}. How many more does {n} have?",
        "A mountain is {a} metres high and a hill is {b} metres high. How much higher is the mountain?",
        "{n} scored {a} points and a friend scored {b}. By how much did {n} win?",
        "How much more is {a} than {b}?",
    ), (
        "By how much does {a} exceed {b}?",
    )),
}  # fmt: skip


def _word_values(rng: random.Random, structure: str) -> dict[str, int | str]:
    while True:
        a, b, c = rng.randint(2, 999), rng.randint(2, 99), rng.randint(1, 999)
        if structure == "change":
            b, c = rng.randint(2, 20), rng.randint(1, 50)
            a = rng.randint(b * c, b * c + 500)
        if structure == "share":
            a = b * rng.randint(1, 99)
        if structure in ("spend", "more") and a < b + (c if structure == "spend" else 0):
            continue
        if structure == "net" and a * b < c:
            continue
        return {"a": a, "b": b, "c": c}


def _word_problem(held: bool):
    def make(c: Conv, rng: random.Random) -> Turn:
        structure = rng.choice(list(_STRUCTURES))
        expr_t, train_t, held_t = _STRUCTURES[structure]
        vals = _word_values(rng, structure)
        t = rng.choice(held_t if held else train_t)
        q = t.format(n=rng.choice(_NAMES), i=rng.choice(_ITEMS), **vals)
        return answer_with_calculator(c, q, expr_t.format(**vals))

    return make


# -- multi-step instructions -------------------------------------------------------------------

_STEP1 = {"*": "multiply {a} by {b}", "+": "add {a} and {b}", "-": "subtract {b} from {a}"}
_STEP2 = {"*": "multiply the result by {c}", "+": "add {c}", "-": "subtract {c}", "/": "divide by {c}"}
_MULTI = (("First {s1}, then {s2}.", "{S1}, then {s2}.", "Please {s1} and then {s2}.",
           "Step by step: {s1}, then {s2}. What do you get?", "First {s1}. After that, {s2}.",
           "Start with this: {s1}; then {s2}.", "{S1} and afterwards {s2}."),
          ("Start by doing this: {s1}. After that, {s2}.", "Can you {s1}, and {s2} afterwards?"))  # fmt: skip


def _multi(held: bool):
    def make(c: Conv, rng: random.Random) -> Turn:
        while True:
            o1, o2 = rng.choice("*+-"), rng.choice("*+-/")
            a, b, cc = rng.randint(2, 999), rng.randint(2, 999), rng.randint(2, 99)
            first = {"*": f"{a} * {b}", "+": f"{a} + {b}", "-": f"{a} - {b}"}[o1]
            left = f"({first})" if o1 in "+-" and o2 in "*/" else first
            e = f"{left} {o2} {cc}"
            if _valid(e):
                break
        s1 = _STEP1[o1].format(a=a, b=b)
        q = rng.choice(_MULTI[held]).format(s1=s1, S1=s1[0].upper() + s1[1:], s2=_STEP2[o2].format(c=cc))
        return answer_with_calculator(c, q, e)

    return make


def _long_copy(c: Conv, rng: random.Random) -> Turn:
    """Long digit strings copied exactly (the calculator gets them digit for digit)."""
    a, b = digits(rng, 6, 14), digits(rng, 1, 8)
    op = rng.choice("+-*")
    e = f"{a} {op} {b}"
    if not _valid(e):
        e = f"{a} + {b}"
    return answer_with_calculator(c, rng.choice(_CALC_TRAIN["en"]).format(e=e), e)


FAMILIES: tuple[Family, ...] = (
    Family("calc", "calc", _calc(_CALC_TRAIN), weight=3.0),
    Family("calc_long", "calc", _long_copy),
    Family("calc_recover", "calc", _calc_recover, weight=0.4),
    Family("calc_held", "calc", _calc(_CALC_HELD), held_out=True),
    Family("number_words", "number_words", _number_words(False)),
    Family("number_words_held", "number_words", _number_words(True), held_out=True),
    Family("word_problem", "calc_word", _word_problem(False)),
    Family("word_problem_held", "calc_word", _word_problem(True), held_out=True),
    Family("multi_step", "calc_multi", _multi(False)),
    Family("multi_step_held", "calc_multi", _multi(True), held_out=True),
)
