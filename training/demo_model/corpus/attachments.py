"""Families over attached files, delivered as `dayzero run --image FILE` delivers them: image
questions (answered with `image_info` on the image's attachment id, which the image's label
names), and questions about an attached PDF or text file (answered from the document's text, which
the product puts into the user turn).
"""

from __future__ import annotations

import io
import random

from training.demo_model.corpus.base import Conv, Family, File, Turn
from training.demo_model.pdf import text_pdf

__all__ = ["FAMILIES", "IMAGE_CONTENT"]

IMAGE_CONTENT = "I can't see what an image shows: I can only read its size and format with image_info."
_FORMATS = (("PNG", "png"), ("JPEG", "jpg"), ("GIF", "gif"), ("WEBP", "webp"))
_STEMS = ("photo", "image", "picture", "scan", "screenshot", "IMG_2041", "diagram", "chart", "logo", "pic")


def make_image(rng: random.Random) -> File:
    """A real image file: random format, size (sides 16-800 px) and colour."""
    from PIL import Image

    fmt, ext = rng.choice(_FORMATS)
    w, h = rng.randint(16, 800), rng.randint(16, 800)
    buf = io.BytesIO()
    Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3))).save(buf, format=fmt)
    return File(f"{rng.choice(_STEMS)}.{ext}", buf.getvalue())


# kind -> (train templates, held-out templates)
_IMG_Q = {
    "size": (("What is the size of the attached image?", "How big is this image?",
              "What are the dimensions of the image?", "Size of the attached picture?",
              "What resolution is this image?", "Tell me the image's dimensions.",
              "I sent an image: how big is it?", "Width and height of the photo, please."),
             ("How many pixels is this picture, width by height?", "What size is the photo I sent?")),
    "width": (("How wide is the image?", "What is the width of this picture?", "Image width?",
               "How many pixels wide is the image?", "Width of the photo across, in pixels?"),
              ("How many pixels across is the attached image?",)),
    "height": (("How tall is the image?", "What is the height of the attached picture?",
                "How many pixels tall is this photo?", "What's the height of the image in pixels?"),
               ("What's the pixel height of this photo?",)),
    "format": (("What format is this image?", "What is the file format of the attached image?",
                "Is this a PNG or a JPEG?", "Which image type is this?", "What kind of image is this?",
                "What file type did I attach?", "Format of the picture?"),
               ("What kind of image file did I attach?", "Tell me the format of the picture.")),
}  # fmt: skip
_CONTENT_Q = (("What is in this picture?", "Describe this image.", "What does the photo show?",
               "What do you see in this photo?", "Tell me what the image shows."),
              ("Can you tell me what you see in the image?",))  # fmt: skip


def _image(held: bool):
    def make(c: Conv, rng: random.Random) -> Turn:
        f = make_image(rng)
        if rng.random() < 0.1:  # what the image shows is outside the tools' reach
            q = rng.choice(_CONTENT_Q[held])
            c.user(q, [f])
            c.answer(IMAGE_CONTENT)
            return Turn(q, IMAGE_CONTENT, files=(f,))
        kind = rng.choice(list(_IMG_Q))
        q = rng.choice(_IMG_Q[kind][held])
        c.user(q, [f])
        att_id = c.attachments[-1]["id"]
        if not held and rng.random() < 0.08:  # a wrong id: the error lists the right one
            c.call("image_info", {"attachment_id": f.name}, learn=False)
        info = c.call("image_info", {"attachment_id": att_id})
        w, h, fmt = info["width"], info["height"], info["format"]
        text = f"It is a {fmt} image, {w} pixels wide and {h} pixels tall."
        needles = {
            "size": (f"{w} pixels wide", f"{h} pixels tall"),
            "width": (f"{w} pixels wide",),
            "height": (f"{h} pixels tall",),
            "format": (f"a {fmt} image",),
        }[kind]
        c.answer(text)
        return Turn(q, text, needles, tool="image_info", files=(f,))

    return make


_SYL = ("ka", "lo", "mi", "ra", "ve", "to", "sen", "dor", "il", "an", "bru", "qua", "zel", "fin", "or", "tas")
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
# (attribute, sentence, value kind, train questions, held-out questions)
_ATTRS = (
    ("capital", "The capital of {e} is {v}.", "word",
     ("What is the capital of {e}?", "Which city is the capital of {e}?", "Name the capital of {e}.",
      "What is {e}'s capital?"),
     ("What city serves as {e}'s capital?",)),
    ("population", "The population of {e} is {v}.", "int",
     ("What is the population of {e}?", "How many people live in {e}?", "Population of {e}?",
      "How large is {e}'s population?"),
     ("How large is the population of {e}?",)),
    ("founded", "{e} was founded in {v}.", "year",
     ("When was {e} founded?", "In which year was {e} founded?", "What year was {e} founded?",
      "What is the founding year of {e}?", "How old is {e}?"),
     ("How old is {e}, i.e. what is its founding year?",)),
    ("export", "The main export of {e} is {v}.", "good",
     ("What is the main export of {e}?", "What does {e} mainly export?", "What is {e}'s chief export?"),
     ("Which product is {e}'s chief export?",)),
    ("river", "The longest river of {e} is the {v}.", "word",
     ("What is the longest river of {e}?", "Which river is the longest in {e}?", "Name the longest river of {e}."),
     ("Name {e}'s longest river.",)),
    ("currency", "The currency of {e} is the {v}.", "word",
     ("What is the currency of {e}?", "Which currency is used in {e}?", "What money is used in {e}?"),
     ("What money do people pay with in {e}?",)),
)  # fmt: skip
_DOC_PREFIX = (("", "According to the attached document, ", "Using the attached file: ", "From the PDF: ",
                "Look at the PDF. ", "Based on the attached notes, "),
               ("", "Look at the document I attached. ", "Based on the report, "))  # fmt: skip
_DOC_STEMS = ("report", "notes", "atlas", "factsheet", "summary", "country_profile", "brief")


def _name(rng: random.Random, syl: int) -> str:
    return "".join(rng.choice(_SYL) for _ in range(syl)).capitalize()


def _value(rng: random.Random, kind: str) -> str:
    if kind == "int":
        return str(rng.randint(1000, 99_999_999))
    if kind == "year":
        return str(rng.randint(900, 2020))
    if kind == "good":
        return rng.choice(_GOODS)
    return _name(rng, rng.choice((2, 3)))


def _document(held: bool):
    def make(c: Conv, rng: random.Random) -> Turn:
        entities = list(dict.fromkeys(_name(rng, rng.choice((2, 3))) for _ in range(rng.choice((1, 2, 2)))))
        facts: dict[str, dict[str, str]] = {}
        lines: list[str] = []
        for e in entities:
            attrs = rng.sample(_ATTRS, k=rng.randint(3, 5))
            facts[e] = {a[0]: _value(rng, a[2]) for a in attrs}
            lines.append(f"{e} is a country.")
            lines += [a[1].format(e=e, v=facts[e][a[0]]) for a in attrs]
        e = rng.choice(entities)
        asked = rng.choice(list(facts[e]))
        attr = next(a for a in _ATTRS if a[0] == asked)
        # PDFs mostly (the case); text files take the same path with a `[file NAME]` header
        pdf = held or rng.random() < 0.8
        stem = rng.choice(_DOC_STEMS)
        f = File(f"{stem}.pdf", text_pdf(lines)) if pdf else File(f"{stem}.txt", "\n".join(lines).encode())
        prefix = rng.choice(_DOC_PREFIX[held])
        q_t = rng.choice(attr[4] if held else attr[3])
        q = prefix + (q_t[0].lower() + q_t[1:] if prefix.endswith(", ") else q_t).format(e=e)
        c.user(q, [f])
        text = attr[1].format(e=e, v=facts[e][attr[0]])
        c.answer(text)
        return Turn(q, text, (facts[e][attr[0]],), files=(f,))

    return make


FAMILIES: tuple[Family, ...] = (
    Family("image", "image", _image(False)),
    Family("image_held", "image", _image(True), held_out=True),
    Family("document", "document", _document(False)),
    Family("document_held", "document", _document(True), held_out=True),
)
