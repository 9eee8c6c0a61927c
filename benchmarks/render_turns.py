"""Per-turn host cost of a growing conversation on the inference server's front end: rendering the
checkpoint's chat template and tokenizing, with the conversation keyed (`prompt_cache_key`: only
new messages are tokenized) vs rendered in full, at transcripts of 32K to 1M tokens (the bundled
demo model's tokenizer and template; a document-question agent loop of ~1.4K-token turns).

    python -m benchmarks.render_turns [--out docs/results/render_turns.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

SIZES = (32_768, 131_072, 524_288, 1_048_576)


def main() -> int:
    from inference.chat import load_frontend
    from inference.demo_model.spec import DEMO_DIR
    from inference.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tok = load_tokenizer(DEMO_DIR)
    renderer = load_frontend(tok, DEMO_DIR).renderer
    doc = "The quarterly report shows revenue of 1234 units in region 7. " * 40
    msgs = [{"role": "system", "content": "You answer from the documents."}]
    rows, sizes = [], list(SIZES)
    turn = 0
    while sizes:
        turn += 1
        msgs.append({"role": "user", "content": f"Document {turn}: {doc}"})
        t0 = time.perf_counter()
        keyed = renderer.render(msgs, conversation="bench")
        t_keyed = time.perf_counter() - t0
        if len(keyed.token_ids) >= sizes[0]:
            sizes.pop(0)
            t0 = time.perf_counter()
            full = renderer.render(msgs)
            t_full = time.perf_counter() - t0
            if full.token_ids != keyed.token_ids:
                raise SystemExit("keyed render differs from the full render")
            rows.append({
                "tokens": len(keyed.token_ids), "turn": turn, "incremental": keyed.incremental,
                "keyed_ms": round(1000 * t_keyed, 2), "full_ms": round(1000 * t_full, 2),
            })  # fmt: skip
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        msgs.append({"role": "assistant", "content": f"Noted document {turn}."})
    result = {
        "machine": f"{platform.machine()} CPU, {platform.python_version()}",
        "stats": renderer.stats,
        "turns": rows,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
