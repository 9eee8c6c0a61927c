"""Token sampling from logits: greedy, temperature, top-k, top-p, per-request seeds, logprobs."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from inference.engine.request import SamplingParams, TokenLogprob


class Sampler:
    """Samples one token per row. Rows with a seed use their own generator, advanced once per
    token, so a seeded request gives the same tokens alone or batched."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, req_id: str) -> None:
        self._generators.pop(req_id, None)

    def _generator(self, req_id: str, seed: int, device: torch.device) -> torch.Generator:
        g = self._generators.get(req_id)
        if g is None:
            g = torch.Generator(device=device)
            g.manual_seed(seed)
            self._generators[req_id] = g
        return g

    @torch.inference_mode()
    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        req_ids: Sequence[str],
        allowed: Mapping[str, np.ndarray] | None = None,
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """logits [M, V] (any float dtype) -> M token ids and, where asked, their logprobs.
        `allowed`: per request id, an int32 bitmask of the tokens its grammar allows (logprobs are
        then those of the constrained distribution)."""
        if logits.dim() != 2 or logits.shape[0] != len(params):
            raise ValueError(f"logits must be [M, V] with M = {len(params)}, got {tuple(logits.shape)}")
        logits = logits.float()
        if allowed:
            logits = apply_token_masks(logits, req_ids, allowed)
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            idx = torch.tensor(random_rows, device=logits.device)
            sub = logits.index_select(0, idx)
            temp = torch.tensor([params[i].temperature for i in random_rows], device=logits.device)
            probs = self._filtered_probs(sub / temp.unsqueeze(1), [params[i] for i in random_rows])
            q = torch.empty_like(probs)
            for r, i in enumerate(random_rows):
                p = params[i]
                if p.seed is None:
                    q[r].exponential_()
                else:
                    q[r].exponential_(generator=self._generator(req_ids[i], p.seed, logits.device))
            tokens[idx] = (probs / q).argmax(dim=-1)
        token_list = tokens.tolist()
        lps: list[TokenLogprob | None] = [None] * len(params)
        want = [i for i, p in enumerate(params) if p.logprobs is not None]
        if want:
            logp = torch.log_softmax(logits[want], dim=-1)
            for r, i in enumerate(want):
                k = params[i].logprobs
                chosen = float(logp[r, token_list[i]])
                top: tuple[tuple[int, float], ...] = ()
                if k:
                    v, ix = logp[r].topk(k)
                    top = tuple(zip(ix.tolist(), v.tolist(), strict=True))
                lps[i] = TokenLogprob(token_list[i], chosen, top)
        return token_list, lps

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        """Softmax after top-k then top-p filtering (both on the temperature-scaled logits)."""
        V = logits.shape[-1]
        ks = [p.top_k if 0 < p.top_k < V else V for p in params]
        ps = [float(p.top_p) for p in params]
        if any(k < V for k in ks) or any(p < 1.0 for p in ps):
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            rank = torch.arange(V, device=logits.device).unsqueeze(0)
            k_t = torch.tensor(ks, device=logits.device).unsqueeze(1)
            mask = rank >= k_t
            sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
            probs = sorted_logits.softmax(dim=-1)
            cum = probs.cumsum(dim=-1) - probs  # mass strictly before each token
            p_t = torch.tensor(ps, device=logits.device).unsqueeze(1)
            mask = cum >= p_t  # keeps the smallest prefix whose mass reaches top_p (>= 1 token)
            sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
        return logits.softmax(dim=-1)


def apply_token_masks(
    logits: torch.Tensor, req_ids: Sequence[str], allowed: Mapping[str, np.ndarray]
) -> torch.Tensor:
    """-inf where a row's bitmask disallows a token (rows without a mask untouched). The bits are
    unpacked on the logits' device: the host sends 1/32 of a boolean mask."""
    rows = [i for i, r in enumerate(req_ids) if r in allowed]
    if not rows:
        return logits
    words = torch.from_numpy(np.stack([allowed[req_ids[i]] for i in rows])).to(logits.device)
    bits = ((words.unsqueeze(-1) >> _shifts(logits.device)) & 1).reshape(len(rows), -1)[:, : logits.shape[1]]
    if bits.shape[1] < logits.shape[1]:  # ids past the grammar's vocabulary are never allowed
        bits = torch.nn.functional.pad(bits, (0, logits.shape[1] - bits.shape[1]))
    if len(rows) == logits.shape[0]:  # every row constrained: no gather and scatter
        return logits.masked_fill(bits == 0, float("-inf"))
    idx = torch.tensor(rows, device=logits.device)
    logits = logits.clone()
    logits[idx] = logits[idx].masked_fill(bits == 0, float("-inf"))
    return logits


@functools.cache
def _shifts(device: torch.device) -> torch.Tensor:
    return torch.arange(32, device=device, dtype=torch.int32)
