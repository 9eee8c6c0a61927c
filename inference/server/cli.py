"""`dayzero infer serve`: the OpenAI-compatible server. torch loads only when the command runs."""

from __future__ import annotations

import argparse
import os

from inference.server.guard import DEFAULT_MAX_BODY_BYTES


def register_infer(sub: argparse._SubParsersAction) -> None:
    """Add `infer` (with `serve`) to the `dayzero` parser."""
    infer = sub.add_parser("infer", help="inference engine commands")
    isub = infer.add_subparsers(dest="infer_command", required=True, metavar="COMMAND")
    s = isub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--model",
        metavar="DIR",
        help="checkpoint folder as released: config.json, safetensors (+ manifest), tokenizer.json or "
        "tiktoken.model + tokenizer_config.json, chat template",
    )
    src.add_argument(
        "--dummy",
        metavar="CONFIG",
        nargs="?",
        const="",
        help="seeded RANDOM weights for a config.json (none given: the small vision-language test model); "
        "byte tokenizer, answers are meaningless",
    )
    s.add_argument(
        "--host",
        default=os.environ.get("DAYZERO_INFERENCE_HOST", "127.0.0.1"),
        help="address to listen on (or DAYZERO_INFERENCE_HOST; default: %(default)s)",
    )
    port = os.environ.get("DAYZERO_INFERENCE_PORT")
    s.add_argument("--port", type=int, default=int(port) if port else None, required=port is None,
                   help="TCP port (or DAYZERO_INFERENCE_PORT)")  # fmt: skip
    s.add_argument(
        "--served-model-name",
        default=None,
        help="the `model` clients send (default: the checkpoint config's `_name_or_path`, else its folder name)",
    )
    s.add_argument("--device", default="auto", help="cuda, cpu or auto")
    s.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="weights and activations (auto: bfloat16 on CUDA, float32 on CPU; default: %(default)s)",
    )
    s.add_argument("--seed", type=int, default=0, help="seed of --dummy weights")
    s.add_argument(
        "--chat-template",
        metavar="FILE",
        default=None,
        help="a jinja chat template overriding the checkpoint's",
    )
    s.add_argument(
        "--tool-call-parser",
        default="auto",
        help="tool-call format: auto (from the checkpoint), kimi_k2, deepseek_v31, hermes, qwen3_xml, none "
        "(default: %(default)s)",
    )
    s.add_argument(
        "--reasoning-parser",
        default="auto",
        help="reasoning format: auto (from the checkpoint), think (<think>...</think>), none (default: %(default)s)",
    )
    s.add_argument(
        "--max-model-len",
        type=int,
        default=32768,
        help="longest sequence, prompt plus output, in tokens (default: %(default)s)",
    )
    s.add_argument(
        "--max-num-seqs", type=int, default=64, help="most requests running at once (default: %(default)s)"
    )
    s.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=8192,
        help="most tokens one step computes (prefill chunks and decodes) (default: %(default)s)",
    )
    s.add_argument("--block-size", type=int, default=64, help="tokens per KV block (default: %(default)s)")
    s.add_argument(
        "--num-blocks", type=int, default=None, help="default: what --gpu-memory-utilization leaves on CUDA"
    )
    s.add_argument(
        "--num-state-slots", type=int, default=None, help="live + checkpoint slots (default 4x seqs)"
    )
    s.add_argument(
        "--checkpoint-interval",
        type=int,
        default=2048,
        help="tokens between recurrent-state checkpoints of the prefix cache (default: %(default)s)",
    )
    s.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.8,
        help="share of the GPU's memory the engine plans for, the rest is headroom (default: %(default)s)",
    )
    s.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off")
    s.add_argument("--no-chunked-prefill", action="store_true", help="prefill each prompt in one step")
    s.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode steps")
    s.add_argument(
        "--graph-warmup-s",
        type=float,
        default=60.0,
        help="seconds at most spent at start-up capturing the common decode and short-step CUDA graphs "
        "(inference/engine/graph_warmup.py; 0: none, shapes are captured as they occur; default: %(default)s)",
    )
    s.add_argument(
        "--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
        help="auto: the model dtype; fp8: MLA latents as float8_e4m3 with one scale per row",
    )  # fmt: skip
    s.add_argument("--kv-offload-host-gb", type=float, default=0.0,
                   help="pinned host memory for KV blocks and state checkpoints evicted from the GPU (the host's, split over the ranks)")  # fmt: skip
    s.add_argument("--kv-offload-disk-gb", type=float, default=0.0, help="disk tier below the host tier")
    s.add_argument("--kv-offload-disk-url", default="",
                   help="folder or fsspec URL of the disk tier (default: a temporary folder)")  # fmt: skip
    s.add_argument("--kv-offload-min-tokens", type=int, default=0,
                   help="offload only prefixes of sequences at least this long")  # fmt: skip
    s.add_argument(
        "--tensor-parallel-size", type=int, default=1,
        help="ranks splitting heads, FFN columns and vocab (one worker process per rank; gloo on CPU, NCCL on GPU; default: %(default)s)",
    )  # fmt: skip
    s.add_argument(
        "--expert-parallel-size", type=int, default=1,
        help="ranks splitting the routed experts (world size = tensor x expert parallel size; default: %(default)s)",
    )  # fmt: skip
    s.add_argument(
        "--expert-dispatch", choices=["local", "all_to_all"], default="local",
        help="how tokens reach the experts' ranks: picked locally from the replicated tokens, or exchanged (default: %(default)s)",
    )  # fmt: skip
    from inference.parallel.cluster import add_cluster_arguments

    add_cluster_arguments(s)  # --pipeline-parallel-size, --micro-batches, --nnodes, --node-rank, --master-*
    s.add_argument(
        "--api-key",
        default=os.environ.get("DAYZERO_INFERENCE_API_KEY") or None,
        help="require `Authorization: Bearer KEY` on /v1/* (or DAYZERO_INFERENCE_API_KEY; default: none)",
    )
    s.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body in bytes, 413 past it (default: %(default)s)",
    )
    s.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="requests in flight at once, past it they queue (default: --max-num-seqs; 0: no shedding)",
    )
    s.add_argument(
        "--max-queue",
        type=int,
        default=None,
        help="requests waiting for a slot; past it, 429 + Retry-After (default: a quarter of --max-in-flight)",
    )
    s.add_argument(
        "--max-queue-wait",
        type=float,
        default=0.1,
        help="longest wait for a slot in seconds, estimated or actual; past it, 429 (default: %(default)s)",
    )
    s.add_argument(
        "--blob-url",
        default=os.environ.get("DAYZERO_BLOB_DIR"),
        help="the preprocess workers' blob store: accept their processed images by reference "
        "(dayzero-processed:<sha256> image URLs; default DAYZERO_BLOB_DIR, else refused)",
    )
    s.add_argument(
        "--redact-faces", action="store_true", help="blur faces in images this server preprocesses itself"
    )
    s.add_argument(
        "--redact-documents", action="store_true", help="blur text blocks in images it preprocesses itself"
    )
    s.add_argument(
        "--image-url-allow-hosts",
        default=os.environ.get("DAYZERO_INFERENCE_IMAGE_URL_HOSTS", ""),
        help="comma-separated hosts whose http(s) image URLs are fetched (default: none)",
    )
    s.set_defaults(func=_serve)


def engine_config(args: argparse.Namespace):
    """The `EngineConfig` the `serve` flags describe (no torch import)."""
    from inference.cache.tiers import TierConfig
    from inference.engine.engine import EngineConfig
    from inference.engine.graph_warmup import GraphWarmup

    return EngineConfig.of(
        block_size=args.block_size,
        num_blocks=args.num_blocks or 4096,
        num_state_slots=args.num_state_slots or 4 * args.max_num_seqs,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_chunked_prefill=not args.no_chunked_prefill,
        enable_prefix_caching=not args.no_prefix_caching,
        checkpoint_interval=args.checkpoint_interval,
        enable_cuda_graphs=not args.enforce_eager,
        graph_warmup=GraphWarmup(time_budget_s=args.graph_warmup_s),
        kv_cache_dtype=args.kv_cache_dtype,
        tiers=TierConfig(
            host_bytes=int(args.kv_offload_host_gb * (1 << 30)),
            disk_bytes=int(args.kv_offload_disk_gb * (1 << 30)),
            disk_url=args.kv_offload_disk_url,
            offload_min_tokens=args.kv_offload_min_tokens,
        ),
    )


def served_model_name(args: argparse.Namespace) -> str:
    """`--served-model-name`, else the checkpoint config's `_name_or_path`, else its folder's name."""
    import json
    from pathlib import Path

    if args.served_model_name:
        return args.served_model_name
    if args.model is None:
        return Path(args.dummy).stem if args.dummy else "dayzero-small-random"
    config = Path(args.model) / "config.json"
    try:
        name = json.loads(config.read_text()).get("_name_or_path")
    except (OSError, ValueError):
        name = None
    return str(name).rstrip("/").rsplit("/", 1)[-1] if name else Path(args.model).resolve().name


def _serve(args: argparse.Namespace) -> int:
    import logging

    import torch

    from inference.chat import ChatOptions
    from inference.engine.factory import build_engine
    from inference.parallel.cluster import cluster_from_args
    from inference.server.guard import ServerLimits
    from inference.server.images import ImageSources
    from inference.server.serve import run_server

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    cfg = engine_config(args)
    log = logging.getLogger("dayzero.infer")
    if args.model is None:
        log.warning(
            "serving RANDOM weights (--dummy %s): answers are meaningless", args.dummy or "small test model"
        )
    engine = build_engine(
        model_dir=args.model,
        config=args.dummy or None,
        engine_config=cfg,
        device=device,
        dtype=dtype,
        seed=args.seed,
        mem_fraction=args.gpu_memory_utilization,
        fixed_blocks=args.num_blocks is not None,
        tensor_parallel_size=args.tensor_parallel_size,
        expert_parallel_size=args.expert_parallel_size,
        expert_dispatch=args.expert_dispatch,
        pipeline_parallel_size=args.pipeline_parallel_size,
        micro_batches=args.micro_batches,
        cluster=cluster_from_args(args),
    )
    name = served_model_name(args)
    in_flight = args.max_num_seqs if args.max_in_flight is None else args.max_in_flight
    limits = ServerLimits(
        api_key=args.api_key,
        max_body_bytes=args.max_request_bytes,
        max_in_flight=in_flight,
        max_queue=in_flight // 4 if args.max_queue is None else args.max_queue,
        max_queue_wait_s=args.max_queue_wait,
    )
    images = ImageSources(
        blob_url=args.blob_url or None,
        url_allow_hosts=tuple(h.strip() for h in args.image_url_allow_hosts.split(",") if h.strip()),
        redact_faces=args.redact_faces,
        redact_documents=args.redact_documents,
    )
    run_server(
        engine,
        host=args.host,
        port=args.port,
        model_name=name,
        chat=ChatOptions(args.chat_template, args.tool_call_parser, args.reasoning_parser),
        limits=limits,
        images=images,
    )
    return 0
