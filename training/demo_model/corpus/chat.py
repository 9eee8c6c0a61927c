"""Families without a tool: greetings, identity, thanks, and refusals of what no tool can do."""

from __future__ import annotations

import random

from training.demo_model.corpus.base import Conv, Family, Turn

__all__ = ["FAMILIES", "GREETING", "IDENTITY", "REFUSAL", "THANKS"]

# fixed replies: the eval compares answers to them exactly
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

# reply -> (train prompts, held-out prompts)
_PLAIN = (
    (GREETING, ("Hi", "Hello!", "hello", "Good morning", "Hey there", "Hi, what can you do?",
                "What can you do?", "Bonjour", "Hallo!", "Hola", "Say hello.", "Greetings!",
                "What are you able to help with?", "Good afternoon!", "Hey, which tasks can you do?",
                "Say hi in a short sentence."),
               ("Say hello in one short sentence.", "Hey! What kinds of tasks can you handle?", "Good evening!")),
    (IDENTITY, ("Who are you?", "What are you?", "Which model are you?", "Tell me about yourself.",
                "What model is this?", "Please introduce yourself.", "Who am I talking to?"),
               ("Introduce yourself.", "What exactly am I talking to?")),
    (THANKS, ("Thanks!", "Thank you.", "thanks a lot", "Great, thank you!", "Merci !", "Danke!",
              "Thanks, that is helpful.", "Appreciated, thanks!"),
             ("Thanks, that helps.", "Much appreciated!")),
    (REFUSAL, ("What's the weather in Paris today?", "Send an email to my boss.", "Book me a flight to Rome.",
               "What is the latest news?", "What is the price of Bitcoin right now?", "Play some music.",
               "Order a pizza for me.", "Write me a poem about the sea.", "Translate this into French: good night.",
               "Who won the football match yesterday?", "Set an alarm for 7 am.", "What is the capital of France?",
               "Tell me a joke.", "Summarise this web page: example.com", "Write a Python function that sorts a list.",
               "Quel temps fait-il demain ?", "Wie spät ist es?", "Call my mother.", "Who is the president?",
               "Recommend a good film.", "How do I cook rice?", "What time is it in Tokyo?",
               "Check my calendar for tomorrow.", "Reserve a hotel room in Berlin.", "Explain how a car engine works.",
               "Remind me to call the bank.", "Who wrote Don Quixote?", "Draft an email to my landlord.",
               "What is the forecast for tonight?"),
              ("Could you check tomorrow's forecast for Berlin?", "Please reserve a table for two tonight.",
               "Explain quantum physics simply.", "Remind me to buy milk.", "Who wrote Hamlet?",
               "Draft a cover letter for me.")),
)  # fmt: skip


def _plain(held: bool):
    def make(c: Conv, rng: random.Random) -> Turn:
        reply, train, held_out = rng.choices(_PLAIN, (0.3, 0.15, 0.1, 0.45))[0]
        q = rng.choice(held_out if held else train)
        c.user(q)
        c.answer(reply)
        return Turn(q, reply)

    return make


FAMILIES: tuple[Family, ...] = (
    Family("plain", "plain", _plain(False)),
    Family("plain_held", "plain", _plain(True), held_out=True),
)
