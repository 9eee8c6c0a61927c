"""The CUDA graphs' bookkeeping with the forward run eagerly (for tests)."""

from __future__ import annotations

from inference.engine.cuda_graphs import DecodeGraphs, DecodeInputs


class EagerGraphs(DecodeGraphs):
    """Graph bookkeeping (buckets, padded input buffers, scratch block and slot, the runner's
    graph path) with the forward run eagerly on the padded inputs instead of replayed from a
    captured graph: what a graph computes, checkable on the CPU and beside a real replay."""

    def _capture(self, rows, width, tokens=None):
        g = DecodeInputs(
            rows, width, self.block_size, self.device, self.scratch_block, self.scratch_slot, tokens
        )
        self.graphs[(rows, width, tokens)] = g
        return g

    def _replay(self, g):
        return self.outputs(self.model(g.ids, g.meta, self.cache))
