"""The hybrid causal LM: KDA and MLA/DSA mixers, dense and MoE FFNs (published parameter names)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from inference.config import KDA, MLA, MOE, ModelSpec
from inference.kernels.registry import select
from inference.model.cache_tensors import HybridCacheTensors
from inference.model.forward_meta import ForwardMeta
from inference.model.kda import KimiDeltaAttention
from inference.model.layers import RMSNorm
from inference.model.mla import MLAttention
from inference.model.moe import DenseMLP, Expert, SparseMoE

__all__ = ["DecoderLayer", "KimiLinearForCausalLM", "KimiLinearModel"]


class DecoderLayer(nn.Module):
    """Pre-norm residual block: mixer (KDA or MLA) then FFN (`mlp` dense or `block_sparse_moe`).

    `moe_attr` and `expert_cls` are the checkpoint layout of an MoE FFN; a family that keeps the
    same math under other names (DeepSeek-V3: `mlp.experts.N.gate_proj`) overrides only them.
    """

    moe_attr = "block_sparse_moe"
    expert_cls: type[nn.Module] = Expert

    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        self.kind = spec.layer_kinds[layer_idx]
        if self.kind not in (KDA, MLA):
            raise ValueError(f"layer {layer_idx}: no mixer for layer kind {self.kind!r} in this model")
        self.self_attn: nn.Module = (
            KimiDeltaAttention(spec, layer_idx) if self.kind == KDA else MLAttention(spec, layer_idx)
        )
        if spec.mlp_kinds[layer_idx] == MOE and spec.moe is not None:
            setattr(self, self.moe_attr, SparseMoE(spec.hidden_size, spec.moe, self.expert_cls))
            self._ffn_name = self.moe_attr
        else:
            self.mlp = DenseMLP(spec.hidden_size, spec.intermediate_size)
            self._ffn_name = "mlp"
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, x: Tensor, meta: ForwardMeta, cache: HybridCacheTensors) -> Tensor:
        """x: `[T, hidden]` -> `[T, hidden]`."""
        out, residual = self.forward_split(x, None, meta, cache)
        return residual + out

    def forward_split(
        self, x: Tensor, residual: Tensor | None, meta: ForwardMeta, cache: HybridCacheTensors
    ) -> tuple[Tensor, Tensor]:
        """The block on the hidden state `residual + x` (just `x` when `residual` is None), with
        its last residual add left to the caller: returns `(ffn output, residual)`, whose sum is
        `forward`'s result. Each residual add is fused into the norm that follows it (the next
        block's input norm takes this block's last add)."""
        if residual is None:
            normed, residual = self.input_layernorm(x), x
        else:
            normed, residual = self.input_layernorm.add(x, residual)
        h = self.self_attn(normed, meta, cache)
        normed, residual = self.post_attention_layernorm.add(h, residual)
        return getattr(self, self._ffn_name)(normed), residual


class KimiLinearModel(nn.Module):
    """Embedding, decoder stack and final norm (`model.*` in the checkpoint)."""

    layer_cls: type[DecoderLayer] = DecoderLayer

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(self.layer_cls(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, inputs_embeds: Tensor, meta: ForwardMeta, cache: HybridCacheTensors) -> Tensor:
        """inputs_embeds: `[T, hidden]` -> un-normalised final hidden states `[T, hidden]`."""
        x, residual = inputs_embeds, None
        for layer in self.layers:
            x, residual = layer.forward_split(x, residual, meta, cache)
        return residual + x


class KimiLinearForCausalLM(nn.Module):
    """The text model the engine calls: `forward(input_ids, meta, cache) -> logits [M, vocab]`."""

    model_cls: type[KimiLinearModel] = KimiLinearModel

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.model = self.model_cls(spec)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the LM head with the embedding when the config ties them (call after re-materialising)."""
        if self.spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def supports_decode_graphs(self, dtype: torch.dtype) -> bool:
        """Whether a pure-decode forward in `dtype` is free of host syncs (CUDA-graph capturable).

        Not when the MoE would take the per-expert loop (it reads expert counts on the host).
        DSA is: its indexer scoring and radix top-k are Triton kernels whose launches depend on
        the shapes alone (`kernels/dsa`, `kernels/topk`), the selection over the graph's
        block-table width with the keys past each row's length masked.
        """
        return self.spec.moe is None or select("moe_experts", "cuda", dtype) == "fast"

    def supports_short_step_graphs(self, dtype: torch.dtype) -> bool:
        """Whether a short step (`ForwardMeta.row_seq`) in `dtype` is capturable too: also needs
        fla's recurrent KDA kernel (16-bit; the fp32 reference reads lengths on the host)."""
        return self.supports_decode_graphs(dtype) and select("kda", "cuda", dtype) == "fast"

    def embed(self, input_ids: Tensor, image_embeds: Tensor | None = None) -> Tensor:
        """`[T]` ids -> `[T, hidden]`; image placeholder rows are replaced by `image_embeds` in order."""
        if image_embeds is None:
            return self.model.embed_tokens(input_ids)
        token = self.spec.image_token_id
        if token is None:
            raise ValueError("image_embeds given but the config has no image_token_id")
        mask = input_ids == token
        n = int(mask.sum())
        if n != image_embeds.shape[0]:
            raise ValueError(f"{n} image placeholder tokens but {image_embeds.shape[0]} image embeddings")
        x = self.model.embed_tokens(input_ids.masked_fill(mask, 0))
        return x.masked_scatter(mask[:, None], image_embeds.to(x.dtype))

    def forward(
        self,
        input_ids: Tensor,
        meta: ForwardMeta,
        cache: HybridCacheTensors,
        *,
        image_embeds: Tensor | None = None,
    ) -> Tensor:
        """One continuous-batching step.

        Args:
            input_ids: `[T]` new tokens of all sequences, flattened in `meta` order.
            meta: batch layout, cache addresses and state slots.
            cache: the hybrid cache; KDA slots and MLA blocks of these sequences are updated.
            image_embeds: `[num_placeholders, hidden]` embeddings for the image tokens in `input_ids`.
        Returns:
            logits `[M, vocab]` for `meta.logits_indices` (all `T` rows when it is None).
        """
        meta.validate()
        if input_ids.dim() != 1 or input_ids.shape[0] != meta.num_tokens:
            raise ValueError(f"input_ids must be [T={meta.num_tokens}], got {tuple(input_ids.shape)}")
        h = self.model(self.embed(input_ids, image_embeds), meta, cache)
        if meta.logits_indices is not None:
            h = h[meta.logits_indices.to(h.device)]
        return self.lm_head(self.model.norm(h))
