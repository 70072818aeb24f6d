"""Tiny random Diffusers pipelines built from configs (no Hub access).

Each ``build_<name>()`` returns ``(pipeline, call_kwargs)`` on CPU, every
torch module in ``.eval()`` (a model built from a config starts in train mode,
and dropout would make CPU and neuron runs differ). Weights come from
``torch.manual_seed(0)``, so two builds are identical. Tokenizers are
word-level ones made in memory with ``tokenizers``; they only need to turn a
prompt into ids deterministically.
"""
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

_WORDS = """a an the of and on in with photo picture cat dog dance dancing monkey bad quality astronaut
riding horse red blue green big small system describe image by detailing color shape size texture
quantity text spatial relationships objects background user assistant im_start im_end""".split()

# Enough for Flux 2's message format: plain-string or list-of-parts content.
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for part in m['content'] %}{{ part['text'] }} {% endfor %}{% endif %}\n{% endfor %}"
)


def word_tokenizer(model_max_length, bos=True, eos=True, chat_template=None):
    """A fast tokenizer over a fixed small vocabulary: <pad>=0, <unk>=1, <s>=2, </s>=3."""
    specials = ["<pad>", "<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + _WORDS + list("<>|:,.!?"))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    single = " ".join((["<s>"] if bos else []) + ["$A"] + (["</s>"] if eos else []))
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=[("<s>", 2), ("</s>", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=model_max_length, chat_template=chat_template)


def _eval(components):
    for value in components.values():
        if isinstance(value, torch.nn.Module):
            value.eval()
    return components


def _clip_config(**overrides):
    from transformers import CLIPTextConfig

    cfg = dict(bos_token_id=2, eos_token_id=3, pad_token_id=0, hidden_size=32, intermediate_size=37,
               layer_norm_eps=1e-5, num_attention_heads=4, num_hidden_layers=2, vocab_size=100,
               hidden_act="gelu", projection_dim=32, max_position_embeddings=77)
    cfg.update(overrides)
    return CLIPTextConfig(**cfg)


def _t5_encoder(d_model=32):
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    return T5EncoderModel(T5Config(vocab_size=100, d_model=d_model, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                   relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=3,
                                   dropout_rate=0.1))


def _sd_vae(latent_channels=4):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(block_out_channels=(4, 8), in_channels=3, out_channels=3, latent_channels=latent_channels,
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         norm_num_groups=2, sample_size=32)


def sd_unet():
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(block_out_channels=(4, 8), layers_per_block=1, sample_size=16, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                norm_num_groups=2, attention_head_dim=2)


def build_sd():
    from diffusers import DDIMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextModel

    unet = sd_unet()
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(_clip_config())
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    pipe = StableDiffusionPipeline(**_eval(dict(
        unet=unet, scheduler=scheduler, vae=_sd_vae(), text_encoder=text_encoder, tokenizer=word_tokenizer(77),
        safety_checker=None, feature_extractor=None, image_encoder=None)), requires_safety_checker=False)
    return pipe, dict(height=32, width=32, guidance_scale=6.0)


def build_sdxl():
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(0)
    unet = UNet2DConditionModel(block_out_channels=(4, 8), layers_per_block=1, sample_size=16, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
                                use_linear_projection=True, addition_embed_type="text_time",
                                addition_time_embed_dim=8, transformer_layers_per_block=(1, 2),
                                projection_class_embeddings_input_dim=80, cross_attention_dim=64, norm_num_groups=2)
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(_clip_config())
    torch.manual_seed(0)
    text_encoder_2 = CLIPTextModelWithProjection(_clip_config())
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       timestep_spacing="leading", steps_offset=1)
    pipe = StableDiffusionXLPipeline(**_eval(dict(
        unet=unet, scheduler=scheduler, vae=_sd_vae(), text_encoder=text_encoder, text_encoder_2=text_encoder_2,
        tokenizer=word_tokenizer(77), tokenizer_2=word_tokenizer(77), image_encoder=None, feature_extractor=None)))
    return pipe, dict(height=32, width=32, guidance_scale=5.0)


def flux_transformer(num_layers=1, num_single_layers=1, heads=2, head_dim=16, in_channels=4):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(patch_size=1, in_channels=in_channels, num_layers=num_layers,
                                  num_single_layers=num_single_layers, attention_head_dim=head_dim,
                                  num_attention_heads=heads, joint_attention_dim=32, pooled_projection_dim=32,
                                  axes_dims_rope=[head_dim // 4, head_dim // 4, head_dim // 2])


def build_flux():
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline
    from transformers import CLIPTextModel

    transformer = flux_transformer()
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(_clip_config())
    torch.manual_seed(0)
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
                        latent_channels=1, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035)
    pipe = FluxPipeline(**_eval(dict(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
        tokenizer=word_tokenizer(77), text_encoder_2=_t5_encoder(), tokenizer_2=word_tokenizer(512, bos=False),
        image_encoder=None, feature_extractor=None)))
    return pipe, dict(height=8, width=8, guidance_scale=5.0, max_sequence_length=16)


def flux2_transformer():
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(0)
    return Flux2Transformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16,
                                   timestep_guidance_channels=256, axes_dims_rope=[4, 4, 4, 4])


def build_flux2():
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    transformer = flux2_transformer()
    config = Mistral3Config(
        text_config=dict(model_type="mistral", vocab_size=100, hidden_size=16, intermediate_size=37,
                         max_position_embeddings=512, num_attention_heads=4, num_hidden_layers=1,
                         num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=1e9, sliding_window=None,
                         bos_token_id=2, eos_token_id=3, pad_token_id=0),
        vision_config=dict(model_type="pixtral", hidden_size=16, num_hidden_layers=1, num_attention_heads=4,
                           intermediate_size=37, image_size=30, patch_size=6, num_channels=3),
        bos_token_id=2, eos_token_id=3, pad_token_id=0, image_seq_length=4, vision_feature_layer=-1,
        image_token_index=1)
    torch.manual_seed(0)
    text_encoder = Mistral3ForConditionalGeneration(config)
    torch.manual_seed(0)
    vae = AutoencoderKLFlux2(sample_size=32, in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
                             up_block_types=("UpDecoderBlock2D",), block_out_channels=(4,), layers_per_block=1,
                             latent_channels=1, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False)
    pipe = Flux2Pipeline(**_eval(dict(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
        tokenizer=word_tokenizer(512, chat_template=_CHAT_TEMPLATE))))
    return pipe, dict(height=8, width=8, guidance_scale=5.0, max_sequence_length=8, text_encoder_out_layers=(1,))


def qwen_transformer(num_layers=2):
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    return QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=num_layers,
                                       attention_head_dim=16, num_attention_heads=3, joint_attention_dim=16,
                                       guidance_embeds=False, axes_dims_rope=(8, 4, 4))


def build_qwenimage():
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    transformer = qwen_transformer()
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    config = Qwen2_5_VLConfig(
        text_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=100, rope_theta=1e6, bos_token_id=2, eos_token_id=3,
                         rope_scaling=dict(mrope_section=[1, 1, 2], rope_type="default", type="default")),
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16),
        hidden_size=16, vocab_size=100, vision_end_token_id=97, vision_start_token_id=98, vision_token_id=99,
        image_token_id=96, video_token_id=95)
    torch.manual_seed(0)
    text_encoder = Qwen2_5_VLForConditionalGeneration(config)
    pipe = QwenImagePipeline(**_eval(dict(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=text_encoder,
        tokenizer=word_tokenizer(1024, bos=False, eos=False))))
    return pipe, dict(height=32, width=32, true_cfg_scale=1.0, max_sequence_length=16)


def build_wan():
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                                        in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32,
                                        num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                        rope_max_seq_len=32)
    pipe = WanPipeline(**_eval(dict(
        transformer=transformer, transformer_2=None, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=_t5_encoder(), tokenizer=word_tokenizer(512, bos=False))))
    return pipe, dict(height=16, width=16, num_frames=5, guidance_scale=6.0, max_sequence_length=16,
                      negative_prompt="bad quality")


BUILDERS = {"flux": build_flux, "flux2": build_flux2, "qwenimage": build_qwenimage, "sd": build_sd,
            "sdxl": build_sdxl, "wan": build_wan}
