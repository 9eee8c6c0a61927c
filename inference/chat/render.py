"""Messages -> prompt token ids through the checkpoint's chat template: exactly the ids transformers'
`apply_chat_template(..., tokenize=True)` gives for the same files, with three additions.

1. **User text never becomes a special token.** Text that came from a request (message contents,
   tool-call arguments, names) and spells a special token is rendered with that token's first
   character swapped for a noncharacter; where the swap shows up in the rendered text, that span is
   encoded as plain text. Requests without such text (nearly all) take one plain encode.
2. **Images**: each image part is one image token in the template's output (`image_token_id` of the
   model config); it is expanded to the image's embedding count, and its span recorded
   (`MMSpan`) for the prefix cache and the vision tower.
3. **Turns tokenize what is new**: given a conversation key (`prompt_cache_key`), the renderer
   keeps the conversation's text and ids (`conversations.py`) and a turn that extends it
   tokenizes only its new messages; the result equals a full render's (checked per turn, and by
   test against the full path).
4. **Message ends** (prefix-cache checkpoints, rule 4 of the cache): the rendered text of each
   conversation prefix, where it is a prefix of the full text, marks a token position; the
   prefix renders are bounded (none — the tool declarations —, the first two and the last
   `RECENT_ENDS` messages), which covers the reuse cases of a serving workload: shared tools and
   system prompt, and the previous turn.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from inference.cache.coordinator import MMSpan
from inference.cache.records import PrefixLink
from inference.chat.conversations import Conversation, ConversationCache, context_digest
from inference.chat.template import ChatTemplate
from inference.chat.window import WINDOW, head_len, probe_window
from inference.tokenizer import Tokenizer
from inference.wire import chain_digest

ImageHandler = Callable[[Mapping[str, Any]], tuple[int, str, Any]]
RECENT_ENDS = 6
VERIFY_EVERY = 16  # windowed turns between checks against a full render
# the largest conversation (rendered characters) such a check renders in full: a check falls due
# every VERIFY_EVERY windowed turns and is made on the next windowed turn of a conversation this
# small, so that no turn of a long conversation pays for rendering all of it (the template's
# behaviour, not the text's length, is what the check tests)
VERIFY_MAX_CHARS = 1 << 18
_SWAP = "\ufdd0"  # a Unicode noncharacter: never meaningful in text a request sends
IMAGE_PART_TYPES = ("image_url", "image")


@dataclass(slots=True)
class RenderedPrompt:
    token_ids: list[int]
    text: str  # the rendered prompt, before image expansion
    mm_spans: list[MMSpan] = field(default_factory=list)
    mm_payloads: list[Any] = field(default_factory=list)
    message_ends: list[int] = field(default_factory=list)  # token positions after each message
    incremental: bool = False  # a keyed conversation's turn that tokenized only its new messages
    prefix_link: PrefixLink | None = None  # for the engine: what this prompt shares with a kept turn's


def _check_messages(messages: Any, start: int = 0) -> list[Mapping[str, Any]]:
    """`messages` as a list, each from `start` on checked (those before it were, when received)."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, m in enumerate(messages[start:], start):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise ValueError(f"messages[{i}].content must be a string or a list of content parts")
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                raise ValueError(f"messages[{i}].content[{j}] must be an object with a 'type'")
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise ValueError(f"messages[{i}].content[{j}]: a text part needs a string 'text'")
            if part["type"] not in ("text", *IMAGE_PART_TYPES):
                raise ValueError(
                    f"messages[{i}].content[{j}]: unsupported content part type {part['type']!r}"
                )
            if part["type"] in IMAGE_PART_TYPES and m["role"] != "user":
                raise ValueError(f"messages[{i}]: images are accepted in user messages only")
        for j, c in enumerate(m.get("tool_calls") or []):
            fn = c.get("function") if isinstance(c, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise ValueError(
                    f"messages[{i}].tool_calls[{j}] needs a 'function' object with a string 'name'"
                )
    return list(messages)


def _map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        return {k: _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    return value


def strings_of(value: Any) -> list[str]:
    """Every string inside a JSON value (what a request sends as text)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in strings_of(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_of(v)]
    return []


class PromptRenderer:
    """One checkpoint's template + tokenizer; `render` is thread-safe."""

    def __init__(
        self,
        template: ChatTemplate,
        tokenizer: Tokenizer,
        *,
        image_token_id: int | None = None,
        conversations: ConversationCache | None = None,
    ) -> None:
        self.template = template
        self.tok = tokenizer
        self.image_token_id = image_token_id
        self.conversations = conversations if conversations is not None else ConversationCache()
        self.stats = {"incremental": 0, "full": 0}  # turns of keyed conversations, by path
        self.fallbacks: dict[str, int] = {}  # keyed turns rendered in full, by why
        self._window_state: bool | None = None  # window rendering of extensions (`_window`)
        self._ints = list(range(tokenizer.vocab_size))
        self._windowed = 0
        self._verify_due = False
        self.verified = 0  # windowed turns checked against a full render
        self._ends_special = tuple(tokenizer.special_tokens)
        names = sorted(tokenizer.special_tokens, key=len, reverse=True)
        self._special = re.compile("|".join(map(re.escape, names))) if names else None
        self._unswap = {_SWAP + t[1:]: t for t in names}
        self._swapped = re.compile("|".join(map(re.escape, self._unswap))) if names else None

    # -- text ------------------------------------------------------------------------------
    def render_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        return self.template.render(
            messages, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs
        )

    def _forges(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        return self._special is not None and any(self._special.search(s) for s in strings_of(list(messages)))

    def _swap(self, s: str) -> str:
        assert self._special is not None
        return self._special.sub(lambda m: _SWAP + m.group(0)[1:], s)

    def _encode(self, text: str, forged: bool) -> tuple[list[int], str]:
        """Token ids of a rendered text (and the text with swapped spans restored)."""
        if not forged:
            return self.tok.encode(text, allow_special=True), text
        assert self._swapped is not None
        ids: list[int] = []
        restored: list[str] = []
        pos = 0
        for m in self._swapped.finditer(text):
            ids += self.tok.encode(text[pos : m.start()], allow_special=True)
            plain = self._unswap[m.group(0)]
            ids += self.tok.encode(plain, allow_special=False)
            restored += [text[pos : m.start()], plain]
            pos = m.end()
        ids += self.tok.encode(text[pos:], allow_special=True)
        restored.append(text[pos:])
        return ids, "".join(restored)

    # -- the prompt ------------------------------------------------------------------------
    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        kwargs: Mapping[str, Any] | None = None,
        image_handler: ImageHandler | None = None,
        conversation: str | None = None,
        base: Conversation | None = None,
        every_message_end: bool = False,
    ) -> RenderedPrompt:
        """`conversation`: the client's key for this conversation (`prompt_cache_key`): a turn
        that extends what this key last rendered tokenizes only its new messages.
        `base`: that key's conversation when `messages` is known to start with its messages (a
        request that sent only the new ones: `ConversationCache.resolve`); their digest is not
        computed again (nor are they checked again, or searched for images: a conversation with
        images is never kept). `every_message_end`: mark the end of every message, not a bounded
        set (training masks)."""
        start = base.num_messages if base is not None else 0
        msgs = _check_messages(messages, start)
        has_images = any(
            isinstance(m.get("content"), list) and any(p["type"] in IMAGE_PART_TYPES for p in m["content"])
            for m in msgs[start:]
        )
        keyed = conversation is not None and not has_images
        if conversation is not None and has_images:
            self.count_fallback("images")
        if keyed:
            out = self._extend(conversation, msgs, tools, kwargs, add_generation_prompt, base)
            self.stats["incremental" if out is not None else "full"] += 1
            if out is not None:
                return out
        forged = self._forges(msgs)
        if forged:
            msgs = _map_strings(msgs, self._swap)
            if keyed:
                self.count_fallback("special_token_text")
        text = self.render_text(msgs, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
        ids, real_text = self._encode(text, forged)
        ends = self._message_ends(msgs, tools, kwargs, text, real_text, ids, forged, every_message_end)
        out = RenderedPrompt(ids, real_text, message_ends=ends)
        if keyed and not forged:
            kept = self._remember(conversation, msgs, tools, kwargs, text, ids, ends, base)
            out.prefix_link = PrefixLink(kept.lineage) if kept is not None else None
        images = [
            p
            for m in msgs
            if isinstance(m.get("content"), list)
            for p in m["content"]
            if p["type"] in IMAGE_PART_TYPES
        ]
        if images:
            self._expand_images(out, images, image_handler)
        return out

    def _expand_images(
        self, out: RenderedPrompt, images: list[Mapping[str, Any]], handler: ImageHandler | None
    ) -> None:
        if handler is None or self.image_token_id is None:
            raise ValueError("this model/engine does not accept images")
        where = [i for i, t in enumerate(out.token_ids) if t == self.image_token_id]
        if len(where) != len(images):
            raise ValueError(
                f"the chat template ({self.template.origin}) placed {len(where)} image tokens for "
                f"{len(images)} images"
            )
        ids: list[int] = []
        prev = 0
        shift: list[tuple[int, int]] = []  # (position in the unexpanded ids, tokens added there)
        for pos, part in zip(where, images, strict=True):
            n, digest, payload = handler(part)
            ids += out.token_ids[prev:pos]
            out.mm_spans.append(MMSpan(len(ids), n, digest))
            out.mm_payloads.append(payload)
            ids += [self.image_token_id] * n
            shift.append((pos, n - 1))
            prev = pos + 1
        ids += out.token_ids[prev:]
        out.token_ids = ids
        out.message_ends = [e + sum(k for p, k in shift if p < e) for e in out.message_ends]

    # -- keyed conversations -----------------------------------------------------------------
    def _remember(
        self,
        key: str,
        msgs: list[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        kwargs: Mapping[str, Any] | None,
        text: str,
        ids: list[int],
        ends: list[int],
        base: Conversation | None,
    ) -> Conversation | None:
        """Keep a fully rendered turn's conversation: its text without the generation prompt."""
        body = self.render_text(msgs, tools, add_generation_prompt=False, kwargs=kwargs)
        if not text.startswith(body) or not self._at_special(text, len(body)):
            self.count_fallback("template")
            self.conversations.drop(key)
            return None
        body_ids = ids if len(body) == len(text) else self.tok.encode(body, allow_special=True)
        if ids[: len(body_ids)] != body_ids:
            self.count_fallback("template")
            self.conversations.drop(key)
            return None
        n = len(body_ids)
        conv = Conversation(
            context_digest(tools, kwargs),
            len(msgs),
            body,
            self._interned(body_ids),
            [e for e in ends if e <= n],
            msgs,
            _digest_of(msgs, base),
        )
        self.conversations.put(key, conv)
        return conv

    def _interned(self, ids: list[int]) -> list[int]:
        """The same ids as shared int objects: a kept conversation costs a pointer per token."""
        table = self._ints
        try:
            return [table[t] for t in ids]
        except IndexError:  # an id past the vocabulary (added tokens): as it is
            n = len(table)
            return [table[t] if 0 <= t < n else t for t in ids]

    def count_fallback(self, reason: str) -> None:
        """A keyed turn that could not be tokenized incrementally, by why (the server's metrics)."""
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    def _at_special(self, text: str, pos: int) -> bool:
        """Whether a special token ends or starts at `pos`: tokenizers split text at special tokens
        first, so text cut there tokenizes in pieces exactly as whole."""
        return (
            text.endswith(self._ends_special, 0, pos)  # (no copy of the text before `pos`)
            or text.startswith(self._ends_special, pos)
            or pos == len(text)
        )

    def _extend(
        self,
        key: str,
        msgs: list[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        kwargs: Mapping[str, Any] | None,
        add_generation_prompt: bool,
        base: Conversation | None,
    ) -> RenderedPrompt | None:
        """A turn that extends the conversation `key` last rendered, tokenizing only its new
        messages (None: it does not extend it, and the caller renders in full)."""
        conv = self.conversations.get(key)
        if conv is None:
            self.count_fallback("new_conversation")
            return None
        if conv.num_messages >= len(msgs) or conv.context != context_digest(tools, kwargs):
            self.count_fallback("not_an_extension")
            return None
        if self._forges(msgs[conv.num_messages :]):
            return None  # counted by the full path (`special_token_text`)
        cut = len(conv.text)
        rendered = self._window(conv, msgs, tools, kwargs, add_generation_prompt)
        if rendered is None:
            text = self.render_text(msgs, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
            body = self.render_text(msgs, tools, add_generation_prompt=False, kwargs=kwargs)
        else:
            body, text = rendered
        if not (
            (
                rendered is not None or (body.startswith(conv.text) and text.startswith(body))
            )  # (a window's are)
            and self._at_special(body, cut)
            and self._at_special(text, len(body))
        ):
            # the template renders earlier messages differently once more follow (or cuts
            # between messages inside a token): this template cannot be rendered incrementally
            self.count_fallback("template")
            return None
        # only the new messages are tokenized; the ends of all but the last new message are not
        # marked (the previous turn's reply end is the engine's own checkpoint)
        new = self._interned(self.tok.encode(body[cut:], allow_special=True))
        n = conv.n_ids + len(new)
        ends = [*conv.ends, n] if len(body) < len(text) else list(conv.ends)
        digest = _digest_of(msgs, conv)
        ids = self.conversations.grown_ids(conv, new)
        grown = Conversation(conv.context, len(msgs), body, ids, ends, msgs, digest, n)
        self.conversations.put(key, grown)
        prompt = ids[:n]  # the engine's own list (handed over to it): one copy per turn
        prompt += self.tok.encode(text[len(body) :], allow_special=True)
        # both this prompt and the one rendered with `conv` start with `conv.ids[:conv.n_ids]`
        link = PrefixLink(grown.lineage, conv.lineage, conv.n_ids)
        ends = [e for e in ends if 0 < e < len(prompt)]
        return RenderedPrompt(prompt, text, message_ends=ends, incremental=True, prefix_link=link)

    def _window(
        self,
        conv: Conversation,
        msgs: list[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        kwargs: Mapping[str, Any] | None,
        add_generation_prompt: bool,
    ) -> tuple[str, str] | None:
        """(body, text) of an extension with the template rendered over a window only: the
        leading system messages and first user message, the last `WINDOW` kept messages, the new
        ones; what the new messages add to the window's render is what they add to the whole.
        That holds for templates that render each message from its neighbours and the start of
        the conversation (the layouts we serve); it is checked for this template once on a
        probe conversation (`window_ok`), and every `VERIFY_EVERY`-th windowed turn (of a
        conversation up to `VERIFY_MAX_CHARS`) against a full render, which turns window mode off
        for good on any difference. None: render in
        full (window mode off, or the window's render does not extend)."""
        if not self.window_ok():
            return None
        n = conv.num_messages
        head = head_len(msgs)
        if n - WINDOW <= head:
            return None  # a short conversation: the window would be the whole
        old = [*msgs[:head], *msgs[n - WINDOW : n]]
        try:
            w_old = self.render_text(old, tools, add_generation_prompt=False, kwargs=kwargs)
            w_body = self.render_text([*old, *msgs[n:]], tools, add_generation_prompt=False, kwargs=kwargs)
            w_text = (
                self.render_text([*old, *msgs[n:]], tools, add_generation_prompt=True, kwargs=kwargs)
                if add_generation_prompt
                else w_body
            )
        except ValueError:
            return None
        if not (w_body.startswith(w_old) and w_text.startswith(w_body)):
            return None
        body = conv.text + w_body[len(w_old) :]
        text = body + w_text[len(w_body) :]
        self._windowed += 1
        self._verify_due = self._verify_due or self._windowed % VERIFY_EVERY == 0
        if self._verify_due and len(text) <= VERIFY_MAX_CHARS:
            self._verify_due = False
            self.verified += 1
            full = self.render_text(msgs, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
            if full != text:
                self._window_state = False
                self.count_fallback("template_window")
                return None
        return body, text

    def window_ok(self) -> bool:
        """Whether this template renders extensions over a window exactly as in full, on a probe
        agent conversation (system, user, tool calls and results, answers, a new user turn)."""
        if self._window_state is None:
            self._window_state = probe_window(self.render_text)
            if not self._window_state:
                self.count_fallback("template_window")
        return self._window_state

    def _message_ends(
        self,
        msgs: list[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        kwargs: Mapping[str, Any] | None,
        text: str,
        real_text: str,
        ids: list[int],
        forged: bool,
        every: bool = False,
    ) -> list[int]:
        n = len(msgs)
        recent = range(1 if every else max(1, n - RECENT_ENDS + 1), n + 1)
        wanted = sorted({k for k in (0, 1, 2) if k <= n} | set(recent))
        table = self.tok.token_bytes()
        cum = list(accumulate(len(table[t]) if 0 <= t < len(table) else 0 for t in ids)) if table else None
        ends: list[int] = []
        for k in wanted:
            try:
                prefix = self.render_text(msgs[:k], tools, add_generation_prompt=False, kwargs=kwargs)
            except ValueError:  # a template may refuse a conversation cut short (e.g. no user turn)
                continue
            if not prefix or not text.startswith(prefix) or len(prefix) > len(text):
                continue
            nbytes = len(real_text[: len(prefix)].encode("utf-8"))
            if cum is not None:
                pos = _index_of(cum, nbytes)
            else:
                sub = self._encode(prefix, forged)[0]
                pos = len(sub) if ids[: len(sub)] == sub else None
            if pos is not None and (not ends or pos > ends[-1]):
                ends.append(pos)
        return ends


def _same_messages(old: Sequence[Any], msgs: Sequence[Any]) -> bool:
    """Whether `msgs` starts with the very message objects of `old` (identity: O(1) a message,
    no comparison of contents; equal copies count as different and are hashed again)."""
    return len(old) <= len(msgs) and all(a is b for a, b in zip(old, msgs, strict=False))


def _digest_of(msgs: Sequence[Any], base: Conversation | None) -> str | None:
    """The chained digest of `msgs`, extending `base`'s where `msgs` starts with its messages and
    its digest is known; else None: computed when first asked for (`ConversationCache.resolve`),
    so that requests which send the whole transcript never pay for it."""
    if base is not None and base.digest is not None and _same_messages(base.messages, msgs):
        return chain_digest(base.digest, msgs[base.num_messages :])
    return None


def _index_of(cum: list[int], nbytes: int) -> int | None:
    """The token count whose bytes add up to exactly `nbytes` (None: a token straddles it)."""
    lo, hi = 0, len(cum)
    while lo < hi:
        mid = (lo + hi) // 2
        if cum[mid] < nbytes:
            lo = mid + 1
        else:
            hi = mid
    return lo + 1 if lo < len(cum) and cum[lo] == nbytes else None
