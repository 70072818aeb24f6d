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
    torchrun --nproc-per-node 2 examples/diffusion.py --model ./my-flux --tp 2

``--tp N`` shards the transformer across N NeuronCores with Diffusers' tensor
parallelism (``TensorParallelConfig``; FLUX.1, FLUX.2, Qwen-Image and other
transformers with a ``_tp_plan``), one process per core under torchrun. Every
rank runs the whole pipeline; rank 0 prints and saves the image. Without
``--model`` the tiny pipeline is then a FLUX.1 one (a UNet has no plan).

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


_WORDS = "a an the of and on in with photo painting cat dog astronaut horse red blue".split()


def _tokenizer(model_max_length=77, bos=True):
    """A word-level tokenizer over a few words: <pad>=0, <unk>=1, <s>=2, </s>=3."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<s>", "</s>"] + _WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    single = "<s> $A </s>" if bos else "$A </s>"
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=[("<s>", 2), ("</s>", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=model_max_length)


def _clip_text_encoder():
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    return CLIPTextModel(CLIPTextConfig(vocab_size=len(_WORDS) + 4, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, bos_token_id=2, eos_token_id=3,
                                        pad_token_id=0, max_position_embeddings=77))


def tiny_flux_pipeline():
    """A FLUX.1 pipeline with random weights; the transformer has 4 heads, so --tp 2 or 4 divide it."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                         attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                                         pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
    torch.manual_seed(0)
    text_encoder_2 = T5EncoderModel(T5Config(vocab_size=len(_WORDS) + 4, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                             num_heads=4, relative_attention_num_buckets=8, pad_token_id=0,
                                             eos_token_id=3))
    torch.manual_seed(0)
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(8,), layers_per_block=1,
                        latent_channels=1, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035)
    return FluxPipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                        text_encoder=_clip_text_encoder(), tokenizer=_tokenizer(),
                        text_encoder_2=text_encoder_2, tokenizer_2=_tokenizer(64, bos=False))


def tiny_pipeline():
    """A Stable-Diffusion pipeline with random weights, a few thousand parameters per model."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    text_encoder = _clip_text_encoder()
    tokenizer = _tokenizer()
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


def load_pipeline(model: str | None, dtype: torch.dtype, tiny: str = "sd", tp: int = 1):
    from diffusers import DiffusionPipeline

    if model is None:
        print("No --model given: using a tiny pipeline with RANDOM weights. Its image is noise; "
              "pass --model DIR for a real one.")
        pipe = TINY[tiny]()
        # Models built from configs start in train mode (dropout on); from_pretrained puts them in eval.
        for component in pipe.components.values():
            if isinstance(component, torch.nn.Module):
                component.eval()
        if tp > 1:
            shard_transformer(getattr(pipe, "transformer", None), tp)
        return pipe.to(dtype) if dtype != torch.float32 else pipe
    path = Path(model)
    if not (path / "model_index.json").is_file():
        raise SystemExit(f"--model {model}: not a Diffusers pipeline directory (no model_index.json)")
    components = {}
    if tp > 1:
        components["transformer"] = load_sharded_transformer(path, dtype, tp)
    return DiffusionPipeline.from_pretrained(path, torch_dtype=dtype, local_files_only=True, **components)


def _tp_config(tp: int):
    from diffusers import TensorParallelConfig

    return TensorParallelConfig(tp_degree=tp)


def shard_transformer(transformer, tp: int) -> None:
    """Tensor-parallel a transformer already in memory (on CPU): every rank keeps its slice of the
    planned Linear weights; the rest stays replicated."""
    if getattr(type(transformer), "_tp_plan", None) is None:
        raise SystemExit(f"--tp: {type(transformer).__name__} has no tensor-parallel plan (_tp_plan); "
                         "the tiny sd pipeline has a UNet, use --tiny flux")
    transformer.enable_parallelism(config=_tp_config(tp))


def load_sharded_transformer(path: Path, dtype: torch.dtype, tp: int):
    """Read only this rank's slice of each planned weight off disk (Diffusers' from_pretrained
    with a tensor-parallel ``parallel_config``), so no rank ever holds the whole transformer."""
    import diffusers
    from diffusers import DiffusionPipeline

    entry = DiffusionPipeline.load_config(path).get("transformer")
    if not entry or entry[0] != "diffusers":
        raise SystemExit(f"--tp: the pipeline in {path} has no Diffusers transformer to shard (a UNet has no "
                         "tensor-parallel plan)")
    cls = getattr(diffusers, entry[1])
    if getattr(cls, "_tp_plan", None) is None:
        raise SystemExit(f"--tp: {entry[1]} has no tensor-parallel plan (_tp_plan)")
    return cls.from_pretrained(path, subfolder="transformer", torch_dtype=dtype, local_files_only=True,
                               parallel_config=_tp_config(tp))


def init_tensor_parallel(tp: int, device: torch.device) -> tuple[int, torch.device]:
    """One process per NeuronCore, started by torchrun: returns (rank, this rank's device)."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != tp:
        raise SystemExit(f"--tp {tp} needs {tp} processes, one per NeuronCore (found WORLD_SIZE={world}): "
                         f"torchrun --nproc-per-node {tp} examples/diffusion.py --tp {tp} ...")
    if device.type != "neuron":
        raise SystemExit(f"--tp runs on neuron devices, not --device {device}")
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("neuron", local)
    dist.init_process_group("neuron", device_id=device)
    return dist.get_rank(), device


def save_output(result, output: Path) -> None:
    images = getattr(result, "images", None)
    if images is None:  # video pipelines return frames: keep the first frame of the first video
        images = [result.frames[0][0]]
    image = images[0]
    if not hasattr(image, "save"):
        from diffusers.utils import numpy_to_pil

        image = numpy_to_pil(image[None] if image.ndim == 3 else image)[0]
    image.save(output)


TINY = {"sd": tiny_pipeline, "flux": tiny_flux_pipeline}


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
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel degree: shard the transformer across this many NeuronCores "
                        "(run under torchrun --nproc-per-node N)")
    p.add_argument("--tiny", choices=sorted(TINY), default=None,
                   help="which tiny random pipeline to use without --model (default: sd; flux with --tp)")
    p.add_argument("--output", type=Path, default=Path("diffusion.png"))
    p.add_argument("--save-tiny", type=Path, metavar="DIR",
                   help="write the tiny random pipeline to DIR (for --model) and exit")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    if args.tp < 1:
        raise SystemExit("--tp must be at least 1")
    tiny = args.tiny or ("flux" if args.tp > 1 else "sd")
    if args.save_tiny is not None:
        TINY[tiny]().save_pretrained(args.save_tiny)
        print(f"tiny random {tiny} pipeline written to {args.save_tiny}")
        return 0
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        raise SystemExit(f"--device {args.device}: {e}") from None
    if device.type == "neuron" and not torch.neuron.is_available():
        raise SystemExit("the neuron device is not available (is torch_neuronx installed?)")
    if args.tp > 1 and args.offload != "none":
        raise SystemExit("--tp and --offload do not combine: each rank already holds only its shard")

    rank = 0
    if args.tp > 1:
        rank, device = init_tensor_parallel(args.tp, device)
    pipe = load_pipeline(args.model, DTYPES[args.dtype], tiny, args.tp)
    pipe.set_progress_bar_config(disable=rank != 0)
    if args.offload == "none":
        pipe.to(device)
    else:
        getattr(pipe, f"enable_{args.offload}_cpu_offload")(device=device)
    if args.compile:
        name = "unet" if getattr(pipe, "unet", None) is not None else "transformer"
        setattr(pipe, name, torch.compile(getattr(pipe, name), fullgraph=True))

    # Every rank draws the same latents from the same CPU generator: TP ranks must see the same input.
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
    if rank == 0:
        save_output(result, args.output)
        where = f"{args.tp} NeuronCores (tensor parallel)" if args.tp > 1 else str(device)
        print(f"{type(pipe).__name__} on {where} ({args.dtype}, {args.steps} steps): {elapsed:.2f} s; "
              f"wrote {args.output}")
    if args.tp > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
