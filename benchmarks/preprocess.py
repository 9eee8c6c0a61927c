"""Preprocessing throughput per core: dayzero vs transformers' `Kimi_K25ImageProcessor`, one run.

Image sets:
* `real_photos`: scikit-image's bundled sample photographs, the files as packaged (PNG/JPEG,
  82x102 to 1411x1411; real photos use Paeth-filtered PNGs, which the synthetic ones flatter);
* `real_photos_1080p_jpeg`: the same photographs cropped and scaled to 1920x1080, JPEG q90;
* `jpeg_1920x1080`, `png_4000x3000`: a fixed, seeded set of generated photo-like images.
Times bytes -> pixel_values for both implementations on one thread (torch and OpenCV pinned to
one thread), interleaved image by image so machine noise hits both alike. With `--redact`
(the default) a third side, `dayzero_redact`, runs dayzero with face + document redaction on, and
the real-photo sets report the faces and boxes it found against the faces the photos show. Decode is included on
both sides: dayzero's `process_image(bytes)`; the reference gets `PIL.Image.open(bytes)` and
`processor(images=..., return_tensors="pt")`. Every output is checked against the other
(shapes, grids, and pixel values within 1/255 before normalisation).

    python -m benchmarks.preprocess [--sets real_photos,real_photos_1080p_jpeg,jpeg_1920x1080,png_4000x3000]
        [--jpegs 8] [--pngs 3] [--passes 3] [--no-redact] [--out result.json]

Measured on the 2-core CPU box (AMD EPYC, shared with other jobs and loaded: wall figures are
3-5x the CPU ones), `--passes 2 --jpegs 6 --pngs 2 --inference`, images/s per core (CPU time):
  real_photos (24 as shipped)      dayzero 215.4 | Kimi_K25ImageProcessor 133.0 | redaction on 58.7
  real_photos_1080p_jpeg (24)      dayzero  85.6 | reference 39.6 | redaction on 34.9 (28.6 ms/img)
  jpeg_1920x1080 (generated)       dayzero  79.9 | reference 37.5 | redaction on 36.4
  png_4000x3000 (generated)        dayzero   7.9 | reference  4.0 | redaction on  5.6
Outputs identical to the reference (max diff 0 levels); redaction on the real-photo sets: both faces
found (astronaut, camera), no false face box, text boxes only on page.png. Inference side per
1080p image: 11.4 ms CPU to take a data URL (decode + preprocess) vs 6.3 ms by reference (load +
verify the workers' stored uint8 patches); the workers spend 17.2 ms. A turn with a 1080p image
(2,730 prompt tokens, small random-weight model): 1,229 ms to the first token the first time,
63 ms again (encoder cache hit, 2,560 tokens from the prefix cache).

Prints one JSON object. `images_per_s_cpu` divides by this process's CPU time (robust on a shared
machine); `images_per_s_wall` by wall time. `decode_only_ms_cpu` is each side's decode alone
(dayzero: `decode_array`; reference: Pillow's open + load), the floor under its per-image time.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import cv2
import isal
import numpy as np
import torch
from PIL import Image

from preprocess import PreprocessConfig, decode_array, process_image


def photo_like(width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth colour fields, hard-edged shapes and sensor-like noise: compresses like a photo."""
    low = rng.integers(0, 256, (max(2, height // 64), max(2, width // 64), 3), dtype=np.uint8)
    img = cv2.resize(low, (width, height), interpolation=cv2.INTER_CUBIC)
    for _ in range(12):
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        if rng.random() < 0.5:
            cv2.circle(img, (x, y), int(rng.integers(10, max(11, height // 4))), color, -1)
        else:
            cv2.rectangle(
                img,
                (x, y),
                (x + int(rng.integers(10, width // 3)), y + int(rng.integers(10, height // 3))),
                color,
                -1,
            )
    img = cv2.GaussianBlur(img, (0, 0), 1.2)
    noise = rng.normal(0.0, 3.0, img.shape)
    return np.clip(img + noise, 0, 255).astype(np.uint8)


def encode(arr: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    if fmt == "JPEG":
        Image.fromarray(arr).save(buf, "JPEG", quality=90)
    else:
        Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


# Faces the bundled samples show (every other sample shows none); the 14x25 GIF is left out.
SAMPLE_FACES = {"astronaut.png": 1, "camera.png": 1}


def real_photos() -> dict[str, bytes]:
    """scikit-image's bundled photographs (files as shipped; no download)."""
    import skimage

    root = Path(skimage.__file__).parent / "data"
    out = {}
    for path in sorted(root.iterdir()):
        photo = path.suffix in (".png", ".jpg") and "chessboard" not in path.name
        if photo and min(Image.open(path).size) >= 32:
            out[path.name] = path.read_bytes()
    return out


def as_1080p_jpeg(data: bytes) -> bytes:
    """Scaled (bicubic) to fit 1920x1080 whole, centred on a mid-grey canvas, JPEG q90. Letterboxed
    rather than cropped: a crop would cut the astronaut's face in half."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    scale = min(1920 / img.width, 1080 / img.height)
    size = (round(img.width * scale), round(img.height * scale))
    canvas = Image.new("RGB", (1920, 1080), (128, 128, 128))
    canvas.paste(img.resize(size, Image.BICUBIC), ((1920 - size[0]) // 2, (1080 - size[1]) // 2))
    return encode(np.asarray(canvas), "JPEG")


def redaction_counts(names: list[str], images: list[bytes], config: PreprocessConfig) -> dict:
    """Faces found vs shown, and boxes where there is no face (documents counted apart)."""
    missed, false_faces, doc_boxes = [], [], {}
    for name, data in zip(names, images, strict=True):
        record = process_image(data, config).redaction
        want = SAMPLE_FACES.get(name, 0)
        if record.faces < want:
            missed.append(name)
        if record.faces > want:
            false_faces.append(name)
        if record.documents:
            doc_boxes[name] = record.documents
    return {
        "faces_shown": sum(SAMPLE_FACES.get(n, 0) for n in names),
        "images_with_missed_face": missed,
        "images_with_false_face_box": false_faces,
        "document_boxes": doc_boxes,  # page.png is a scanned page: text boxes expected there only
    }


def run_set(
    name: str,
    images: list[bytes],
    passes: int,
    reference,
    config: PreprocessConfig,
    redact_config: PreprocessConfig | None = None,
) -> dict:
    std = np.asarray(config.image_std, dtype=np.float32).reshape(1, 3, 1, 1) * 255.0
    max_diff = 0.0
    outputs_match = True
    for data in images:  # warm-up + correctness
        ours = process_image(data, config)
        ref = reference(images=Image.open(io.BytesIO(data)), return_tensors="pt")
        ref_pv = ref["pixel_values"].numpy()
        same_shape = ours.pixel_values.shape == ref_pv.shape
        same_grid = np.array_equal(ours.grid_thw, ref["image_grid_thw"].numpy())
        outputs_match &= same_shape and same_grid
        if same_shape:
            max_diff = max(max_diff, float(np.abs((ours.pixel_values - ref_pv) * std).max()))
    outputs_match &= max_diff <= 1.0 + 1e-3
    sides = ["dayzero", "reference"] + (["dayzero_redact"] if redact_config is not None else [])
    if redact_config is not None:
        for data in images:  # warm-up: the face model loads on first use
            red = process_image(data, redact_config)
            outputs_match &= np.array_equal(red.grid_thw, process_image(data, config).grid_thw)
    times = {side: {"wall": [], "cpu": []} for side in sides}
    for _ in range(passes):
        for data in images:
            for side in sides:
                w0, c0 = time.perf_counter(), time.process_time()
                if side == "dayzero":
                    process_image(data, config)
                elif side == "dayzero_redact":
                    process_image(data, redact_config)
                else:
                    reference(images=Image.open(io.BytesIO(data)), return_tensors="pt")
                times[side]["wall"].append(time.perf_counter() - w0)
                times[side]["cpu"].append(time.process_time() - c0)
    # Decode alone, each side's way: the floor under both numbers (both must decode every image).
    decode = {"dayzero": [], "reference": []}
    for data in images:
        for side in decode:
            c0 = time.process_time()
            if side == "dayzero":
                decode_array(data, config)
            else:
                Image.open(io.BytesIO(data)).load()
            decode[side].append(time.process_time() - c0)
    out: dict = {"images": len(images), "timed_runs_per_side": len(images) * passes}
    for side, t in times.items():
        out[side] = {
            "images_per_s_wall": round(len(t["wall"]) / sum(t["wall"]), 2),
            "images_per_s_cpu": round(len(t["cpu"]) / sum(t["cpu"]), 2),
            "median_ms_wall": round(1000 * statistics.median(t["wall"]), 2),
            "mean_ms_cpu": round(1000 * statistics.mean(t["cpu"]), 2),
        }
        if side in decode:
            out[side]["decode_only_ms_cpu"] = round(1000 * statistics.mean(decode[side]), 2)
    out["speedup_wall"] = round(
        out["dayzero"]["images_per_s_wall"] / out["reference"]["images_per_s_wall"], 2
    )
    out["speedup_cpu"] = round(out["dayzero"]["images_per_s_cpu"] / out["reference"]["images_per_s_cpu"], 2)
    if redact_config is not None:
        out["redact_speedup_cpu_vs_reference"] = round(
            out["dayzero_redact"]["images_per_s_cpu"] / out["reference"]["images_per_s_cpu"], 2
        )
    out["outputs_match"] = bool(outputs_match)
    out["max_abs_diff_levels"] = round(max_diff, 4)  # in 1/255 units, before normalisation
    print(f"{name}: {json.dumps(out)}", file=sys.stderr)
    return out


def inference_side(images: list[bytes], repeats: int) -> dict:
    """Per-image preprocessing on the inference process, before (it decoded and preprocessed the
    image a request carried as a data URL) and after (it loads the workers' stored result by
    reference), in CPU ms; and the time to first token of a turn with a 1080p image, first time vs
    again (vision-encoder cache + prefix cache). The embedded engine on this CPU, one thread,
    the bundled small random-weight VL model (so the tower and prefill are small next to a real one)."""
    import tempfile

    from inference.embedded import EMBEDDED_ENGINE_CONFIG, EmbeddedEngineClient
    from inference.engine.factory import build_engine, small_vl_model_config
    from preprocess import BlobStore, ProcessedCache

    blob_dir = tempfile.mkdtemp(prefix="dz-bench-blobs-")
    store = BlobStore(blob_dir)
    worker_ms, refs = [], []
    for data in images:  # the workers' side, timed too: the cost moves, it does not vanish
        c0 = time.process_time()
        refs.append(ProcessedCache(store).process(data, PreprocessConfig()).processed_sha256)
        worker_ms.append(1000 * (time.process_time() - c0))
    engine = build_engine(config=small_vl_model_config(), engine_config=EMBEDDED_ENGINE_CONFIG)
    client = EmbeddedEngineClient(engine, blob_url=blob_dir)
    handler = client.images
    data_urls = ["data:image/jpeg;base64," + base64.b64encode(d).decode() for d in images]
    ref_urls = [f"dayzero-processed:{sha}" for sha in refs]

    def cpu_ms(urls: list[str]) -> float:
        times = []
        for _ in range(repeats):
            for url in urls:
                c0 = time.process_time()
                handler({"type": "image_url", "image_url": {"url": url}})
                times.append(1000 * (time.process_time() - c0))
        return round(statistics.mean(times), 2)

    def turn(url: str) -> dict:
        content = [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0}
        w0 = time.perf_counter()
        out = client.chat(body)
        return {
            "wall_ms_to_first_token": round(1000 * (time.perf_counter() - w0), 1),
            "engine_ttft_ms": round(out["dayzero"]["ttft_ms"], 1),
            "prompt_tokens": out["usage"]["prompt_tokens"],
            "cached_tokens": out["usage"]["prompt_tokens_details"]["cached_tokens"],
        }

    try:
        result = {
            "images": len(images),
            "worker_process_ms_cpu": round(statistics.mean(worker_ms), 2),
            "inference_side_ms_cpu_before_data_url": cpu_ms(data_urls),
            "inference_side_ms_cpu_after_by_reference": cpu_ms(ref_urls),
            "ttft_1080p_first_time": turn(ref_urls[0]),
            "ttft_1080p_again": turn(ref_urls[0]),
            "encoder_cache": engine.runner.model.encoder_cache.stats(),
        }
    finally:
        client.close()
    print(f"inference_side: {json.dumps(result)}", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    all_sets = "real_photos,real_photos_1080p_jpeg,jpeg_1920x1080,png_4000x3000"
    parser.add_argument("--sets", default=all_sets, help=f"comma-separated, from {all_sets}")
    parser.add_argument(
        "--no-redact", action="store_true", help="skip the redaction-on side (faces + documents)"
    )
    parser.add_argument(
        "--inference",
        action="store_true",
        help="also: inference-side ms per image and TTFT, see inference_side",
    )
    parser.add_argument("--jpegs", type=int, default=8, help="distinct 1920x1080 JPEGs")
    parser.add_argument("--pngs", type=int, default=3, help="distinct 4000x3000 PNGs")
    parser.add_argument("--passes", type=int, default=3, help="timed passes over each set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    from transformers import Kimi_K25ImageProcessor

    reference = Kimi_K25ImageProcessor()
    config = PreprocessConfig()
    redact_config = None if args.no_redact else PreprocessConfig(redact_faces=True, redact_documents=True)
    rng = np.random.default_rng(args.seed)
    wanted = [name.strip() for name in args.sets.split(",") if name.strip()]
    sets: dict[str, dict] = {}
    photos = real_photos() if any(n.startswith("real_photos") for n in wanted) else {}
    for set_name in wanted:
        if set_name == "real_photos":
            names, images = list(photos), list(photos.values())
        elif set_name == "real_photos_1080p_jpeg":
            names, images = list(photos), [as_1080p_jpeg(b) for b in photos.values()]
        elif set_name == "jpeg_1920x1080":
            names, images = [], [encode(photo_like(1920, 1080, rng), "JPEG") for _ in range(args.jpegs)]
        elif set_name == "png_4000x3000":
            names, images = [], [encode(photo_like(4000, 3000, rng), "PNG") for _ in range(args.pngs)]
        else:
            parser.error(f"unknown set {set_name!r}; choose from {all_sets}")
        entry = {"mean_bytes": int(np.mean([len(b) for b in images]))}
        entry.update(run_set(set_name, images, args.passes, reference, config, redact_config))
        if names and redact_config is not None:
            entry["redaction"] = redaction_counts(names, images, redact_config)
        sets[set_name] = entry
    inference = None
    if args.inference:
        photos = photos or real_photos()
        inference = inference_side([as_1080p_jpeg(b) for b in list(photos.values())[:4]], args.passes)

    import PIL
    import transformers

    result = {
        "benchmark": "preprocess",
        "threads": 1,
        "machine": {
            "cpu": _cpu_name(),
            "cpus_visible": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "pillow": PIL.__version__,
            "opencv": cv2.__version__,
            "numpy": np.__version__,
            # dayzero's plain-PNG inflate: ISA-L, bundled in the `isal` wheel
            "isal": isal.__version__,
        },
        "settings": config.to_dict(),
        "redaction_settings": None if redact_config is None else redact_config.to_dict(),
        "sets": sets,
        "inference_side": inference,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
