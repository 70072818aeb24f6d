#!/usr/bin/env python3
"""Text-to-image (or video) with a Diffusers pipeline on the ``neuron`` device.

The pipeline comes from a local directory in Diffusers' layout (``model_index.json``
plus one folder per component, as ``DiffusionPipeline.save_pretrained`` writes it);
nothing is downloaded. Without ``--model`` a tiny randomly initialised
Stable-Diffusion-style pipeline is built from configs instead: it runs every
stage (text encoder, denoising loop, VAE decode) but its image is noise.

Examples::

    python examples/diffusion.py                                  # tiny random pipeline, neuron
    python examples/diffusion.py --model ./my-sd-pipeline --steps 20 --output cat.png
    python examples/diffusion.py --model ./my-flux --dtype bfloat16 --compile
    python examples/diffusion.py --offload model                  # components visit neuron in turn
    python examples/diffusion.py --save-tiny /tmp/tiny-sd         # write the tiny pipeline to disk

Diffusers prints its own progress bar, one tick per denoising step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# Everything is local: never let Diffusers/huggingface_hub try the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def tiny_pipeline():
    """A Stable-Diffusion pipeline with random weights, a few thousand parameters per model."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import CLIPTextConfig, CLIPTextModel, PreTrainedTokenizerFast

    words = "a an the of and on in with photo painting cat dog astronaut horse red blue".split()
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<s>", "</s>"] + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>", model_max_length=77)
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(CLIPTextConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=2, num_attention_heads=4, bos_token_id=2,
                                                eos_token_id=3, pad_token_id=0, max_position_embeddings=77))
    unet = UNet2DConditionModel(block_out_channels=(32, 64), layers_per_block=1, sample_size=32, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                attention_head_dim=8, norm_num_groups=8)
    vae = AutoencoderKL(block_out_channels=(16, 32), in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=8, sample_size=64)
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    pipe = StableDiffusionPipeline(unet=unet, scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                                   tokenizer=tokenizer, safety_checker=None, feature_extractor=None,
                                   image_encoder=None, requires_safety_checker=False)
    return pipe


def load_pipeline(model: str | None, dtype: torch.dtype):
    from diffusers import DiffusionPipeline

    if model is None:
        print("No --model given: using a tiny pipeline with RANDOM weights. Its image is noise; "
              "pass --model DIR for a real one.")
        pipe = tiny_pipeline()
        # Models built from configs start in train mode (dropout on); from_pretrained puts them in eval.
        for component in pipe.components.values():
            if isinstance(component, torch.nn.Module):
                component.eval()
    else:
        path = Path(model)
        if not (path / "model_index.json").is_file():
            raise SystemExit(f"--model {model}: not a Diffusers pipeline directory (no model_index.json)")
        pipe = DiffusionPipeline.from_pretrained(path, torch_dtype=dtype, local_files_only=True)
    return pipe.to(dtype) if model is None and dtype != torch.float32 else pipe


def save_output(result, output: Path) -> None:
    images = getattr(result, "images", None)
    if images is None:  # video pipelines return frames: keep the first frame of the first video
        images = [result.frames[0][0]]
    image = images[0]
    if not hasattr(image, "save"):
        from diffusers.utils import numpy_to_pil

        image = numpy_to_pil(image[None] if image.ndim == 3 else image)[0]
    image.save(output)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", help="local Diffusers pipeline directory (default: tiny random pipeline)")
    p.add_argument("--prompt", default="a photo of an astronaut riding a horse")
    p.add_argument("--steps", type=int, default=4, help="denoising steps")
    p.add_argument("--height", type=int, default=None, help="default: the pipeline's own (32 for the tiny one)")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--guidance-scale", type=float, default=None, help="default: the pipeline's own")
    p.add_argument("--seed", type=int, default=0, help="seed of the CPU generator that draws the latents")
    p.add_argument("--device", default="neuron")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--compile", action="store_true", help="torch.compile the transformer/UNet (fullgraph)")
    p.add_argument("--offload", choices=["none", "model", "sequential"], default="none",
                   help="keep weights on CPU and move models (or layers) to the device when used")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (not yet supported)")
    p.add_argument("--output", type=Path, default=Path("diffusion.png"))
    p.add_argument("--save-tiny", type=Path, metavar="DIR",
                   help="write the tiny random pipeline to DIR (for --model) and exit")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tp != 1:
        raise SystemExit("--tp: tensor parallelism is not supported yet (it needs the distributed backend); "
                         "run with --tp 1")
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    if args.save_tiny is not None:
        tiny_pipeline().save_pretrained(args.save_tiny)
        print(f"tiny random pipeline written to {args.save_tiny}")
        return 0
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        raise SystemExit(f"--device {args.device}: {e}") from None
    if device.type == "neuron" and not torch.neuron.is_available():
        raise SystemExit("the neuron device is not available (is torch_neuronx installed?)")

    pipe = load_pipeline(args.model, DTYPES[args.dtype])
    if args.offload == "none":
        pipe.to(device)
    else:
        getattr(pipe, f"enable_{args.offload}_cpu_offload")(device=device)
    if args.compile:
        name = "unet" if getattr(pipe, "unet", None) is not None else "transformer"
        setattr(pipe, name, torch.compile(getattr(pipe, name), fullgraph=True))

    call = dict(prompt=args.prompt, num_inference_steps=args.steps,
                generator=torch.Generator("cpu").manual_seed(args.seed))
    for key in ("height", "width", "guidance_scale"):
        if getattr(args, key) is not None:
            call[key] = getattr(args, key)
    if args.model is None:
        call.setdefault("height", 32)
        call.setdefault("width", 32)
    start = time.perf_counter()
    result = pipe(**call)
    elapsed = time.perf_counter() - start
    save_output(result, args.output)
    print(f"{type(pipe).__name__} on {device} ({args.dtype}, {args.steps} steps): {elapsed:.2f} s; "
          f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
