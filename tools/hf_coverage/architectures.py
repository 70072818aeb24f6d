"""Frozen list of the 100 most popular text-generation architectures for the coverage harness.

Scope
-----
Every entry is a Transformers ``model_type`` that has an entry in
``transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` in the
pinned Transformers version (``TRANSFORMERS_VERSION`` below, 5.18.0), i.e. it can be
built with ``AutoModelForCausalLM.from_config`` and driven by ``generate()``.

How the list was ranked (read this before changing it)
------------------------------------------------------
There was no internet / Hub access when this list was made, so the order is an
**explicit, hand-made popularity ranking**, not a measured one. It is based on
general knowledge of the Hugging Face Hub: how many downloads and fine-tunes /
derivatives a model family has historically had, and how prominent its recent
releases are. Concretely, three tiers were used and ordered by hand inside each tier:

* Tier A (ranks 1-20): the flagship open-weight families that dominate Hub
  text-generation downloads (Llama, Qwen2/Qwen3, Mistral, Gemma, Phi, GPT-2,
  gpt-oss, DeepSeek-V3, Pythia/GPT-NeoX, OPT, SmolLM, Falcon, StarCoder2).
* Tier B (ranks 21-70): well-known families with many checkpoints or a major
  recent release (Granite, OLMo, BLOOM, GPT-J, Command-R, Mamba/Jamba, Qwen3.5,
  Gemma 4, Llama 4, GLM, MiniMax, ERNIE, EXAONE, Hunyuan, Nemotron, LFM2, ...).
* Tier C (ranks 71-100): smaller but recognised families, research
  architectures and older-but-still-used models (Zamba, RecurrentGemma, RWKV,
  XGLM, BioGPT, CTRL, DiffLlama, ...).

Selection rules applied to the 178 causal-LM model types of 5.18.0:

* One entry per architecture: when a multimodal wrapper and its text-only
  decoder both exist, the text-only model_type is used (``gemma3_text`` not
  ``gemma3``, ``llama4_text`` not ``llama4``, ``qwen3_5_text`` not ``qwen3_5``,
  ...). Pure aliases of another class (``gpt-sw3`` -> GPT2LMHeadModel) are skipped.
* Excluded: encoder models used as decoders (BERT/RoBERTa/ELECTRA/... ``*ForCausalLM``),
  decoder halves of encoder-decoder models (BART, Marian, mBART, Pegasus, PLBart,
  ProphetNet, Blenderbot, MVP, Whisper, TrOCR, BigBirdPegasus), audio / speech
  models (MusicGen, Moshi), image-conditioned models (Fuyu, GIT, Emu3, Mllama,
  GOT-OCR2, Phi-4-multimodal, Aria), speculative-decoding drafters
  (``gemma4_assistant`` ...), and very new / niche types for which no
  popularity signal was available (e.g. ``axk1``, ``hy_v4``, ``qwen4_exp_text``,
  ``zaya``, ``inkling_text``).

The list is frozen on purpose: results are only comparable over time if the
denominator does not move. Change it deliberately (and note it in
docs/hf_coverage.md), never automatically. The mandatory families listed in the
coverage issue are all present (checked by ``_self_check``).
"""

from __future__ import annotations

TRANSFORMERS_VERSION = "5.18.0"

# (model_type, short note). Index + 1 == popularity rank.
_RANKED: tuple[tuple[str, str], ...] = (
    # ---- Tier A -----------------------------------------------------------
    ("llama", "Llama 1/2/3.x and countless derivatives"),
    ("qwen2", "Qwen2 / Qwen2.5 (+ Coder, Math, R1 distills)"),
    ("qwen3", "Qwen3 dense"),
    ("mistral", "Mistral 7B / Nemo / Small"),
    ("gemma3_text", "Gemma 3 (1B text-only, text tower of 4B-27B)"),
    ("gpt2", "GPT-2 / DistilGPT2 / many small research models"),
    ("qwen3_moe", "Qwen3-30B-A3B / 235B-A22B / Coder MoE"),
    ("phi3", "Phi-3 / Phi-3.5 / Phi-4 (text)"),
    ("gemma2", "Gemma 2"),
    ("gpt_oss", "gpt-oss-20b / 120b"),
    ("gemma", "Gemma 1 / CodeGemma"),
    ("mixtral", "Mixtral 8x7B / 8x22B"),
    ("deepseek_v3", "DeepSeek-V3 / R1 / V3.1"),
    ("phi", "Phi-1 / 1.5 / 2"),
    ("gpt_neox", "Pythia / GPT-NeoX-20B / StableLM-alpha / Dolly"),
    ("opt", "Meta OPT"),
    ("smollm3", "SmolLM3"),
    ("qwen2_moe", "Qwen1.5-MoE / Qwen2-57B-A14B"),
    ("falcon", "Falcon 7B/40B/180B, Falcon 3"),
    ("starcoder2", "StarCoder2"),
    # ---- Tier B -----------------------------------------------------------
    ("granite", "IBM Granite 3.x dense"),
    ("olmo2", "OLMo 2"),
    ("bloom", "BLOOM / BLOOMZ"),
    ("gptj", "GPT-J 6B"),
    ("cohere", "Command-R / Aya 23"),
    ("mamba", "Mamba (state-space)"),
    ("jamba", "AI21 Jamba (hybrid SSM/attention MoE)"),
    ("qwen3_5_text", "Qwen3.5 dense (text decoder)"),
    ("qwen3_5_moe_text", "Qwen3.5 MoE (text decoder)"),
    ("gemma4_text", "Gemma 4 (text decoder)"),
    ("qwen3_next", "Qwen3-Next (hybrid linear attention MoE)"),
    ("llama4_text", "Llama 4 Scout / Maverick (text decoder)"),
    ("deepseek_v2", "DeepSeek-V2 / V2.5 / Coder-V2"),
    ("glm4_moe", "GLM-4.5 / 4.6 / 4.7"),
    ("gemma3n_text", "Gemma 3n (text decoder)"),
    ("gpt_neo", "GPT-Neo"),
    ("gpt_bigcode", "StarCoder / SantaCoder"),
    ("codegen", "Salesforce CodeGen"),
    ("ministral", "Ministral 8B"),
    ("ministral3", "Ministral 3"),
    ("cohere2", "Command-R7B / Command A"),
    ("phimoe", "Phi-3.5-MoE"),
    ("olmo", "OLMo 1"),
    ("olmoe", "OLMoE"),
    ("olmo3", "OLMo 3"),
    ("granitemoe", "Granite 3.x MoE"),
    ("granitemoehybrid", "Granite 4.0 (hybrid Mamba2/attention MoE)"),
    ("granitemoeshared", "Granite MoE with shared experts"),
    ("mamba2", "Mamba-2 / Codestral Mamba"),
    ("falcon_mamba", "Falcon Mamba"),
    ("falcon_h1", "Falcon-H1 (hybrid)"),
    ("glm4", "GLM-4-0414"),
    ("glm", "GLM-4 (ChatGLM successor)"),
    ("stablelm", "StableLM 2 / Zephyr"),
    ("mpt", "MosaicML MPT"),
    ("deepseek_v32", "DeepSeek-V3.2 (sparse attention)"),
    ("minimax_m2", "MiniMax-M2"),
    ("minimax", "MiniMax-Text-01 (lightning attention)"),
    ("ernie4_5", "ERNIE 4.5 dense"),
    ("ernie4_5_moe", "ERNIE 4.5 MoE"),
    ("exaone4", "EXAONE 4.0"),
    ("hunyuan_v1_dense", "Hunyuan dense"),
    ("hunyuan_v1_moe", "Hunyuan-A13B"),
    ("seed_oss", "ByteDance Seed-OSS"),
    ("nemotron", "Nemotron-3 / Minitron"),
    ("nemotron_h", "Nemotron-H / Nemotron Nano 2 (hybrid)"),
    ("lfm2", "Liquid LFM2"),
    ("lfm2_moe", "Liquid LFM2-MoE"),
    ("kimi_linear", "Kimi Linear"),
    ("dbrx", "Databricks DBRX"),
    # ---- Tier C -----------------------------------------------------------
    ("zamba2", "Zyphra Zamba2"),
    ("bamba", "IBM Bamba"),
    ("recurrent_gemma", "RecurrentGemma (Griffin)"),
    ("persimmon", "Adept Persimmon"),
    ("helium", "Kyutai Helium"),
    ("bitnet", "BitNet b1.58"),
    ("apertus", "Swiss AI Apertus"),
    ("arcee", "Arcee AFM"),
    ("dots1", "rednote dots.llm1"),
    ("longcat_flash", "Meituan LongCat-Flash"),
    ("glm4_moe_lite", "GLM-4.x MoE lite (MLA)"),
    ("glm_moe_dsa", "GLM-5 (MoE + sparse attention)"),
    ("minicpm3", "MiniCPM3"),
    ("jetmoe", "JetMoE"),
    ("zamba", "Zyphra Zamba"),
    ("rwkv", "RWKV-4"),
    ("vaultgemma", "VaultGemma"),
    ("xglm", "Meta XGLM"),
    ("biogpt", "Microsoft BioGPT"),
    ("openai-gpt", "OpenAI GPT-1"),
    ("ctrl", "Salesforce CTRL"),
    ("gpt_neox_japanese", "GPT-NeoX Japanese"),
    ("diffllama", "Differential-attention Llama"),
    ("cwm", "Meta Code World Model"),
    ("exaone_moe", "K-EXAONE MoE"),
    ("mimo_v2_flash", "Xiaomi MiMo-V2-Flash"),
    ("afmoe", "Arcee Trinity (AFMoE)"),
    ("flex_olmo", "FlexOlmo"),
    ("olmo_hybrid", "OLMo Hybrid"),
    ("solar_open", "Upstage Solar Open"),
)

#: The frozen, ranked list of model_type names (rank = index + 1).
ARCHITECTURES: tuple[str, ...] = tuple(name for name, _ in _RANKED)
#: model_type -> human note (family / notable checkpoints).
NOTES: dict[str, str] = dict(_RANKED)

#: Families the coverage issue requires to be in the list.
REQUIRED: frozenset[str] = frozenset(
    "llama qwen2 qwen3 qwen3_moe mistral mixtral gemma gemma2 gemma3_text phi phi3 gpt2 "
    "gpt_neox gpt_oss falcon starcoder2 olmo2 granite deepseek_v3 smollm3 opt bloom gptj "
    "mamba jamba cohere".split()
)

#: Small, diverse CI subset (dense GQA, qk-norm, learned-pos MHA, sliding window,
#: softcapping + alternating attention, fused-qkv, MoE, state-space).
FAST_SUBSET: tuple[str, ...] = (
    "llama",
    "qwen3",
    "gpt2",
    "mistral",
    "gemma2",
    "phi3",
    "qwen3_moe",
    "mamba",
)


def rank(model_type: str) -> int | None:
    """1-based popularity rank of ``model_type`` or None if not in the list."""
    try:
        return ARCHITECTURES.index(model_type) + 1
    except ValueError:
        return None


def _self_check() -> None:
    assert len(ARCHITECTURES) == 100, len(ARCHITECTURES)
    assert len(set(ARCHITECTURES)) == 100, "duplicate model_type"
    missing = REQUIRED - set(ARCHITECTURES)
    assert not missing, f"required families missing: {sorted(missing)}"
    assert set(FAST_SUBSET) <= set(ARCHITECTURES)


_self_check()

if __name__ == "__main__":  # pragma: no cover - convenience listing
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as _M
    except Exception:  # transformers not importable
        _M = {}
    for i, name in enumerate(ARCHITECTURES, 1):
        flag = "" if not _M or name in _M else "   <-- NOT IN INSTALLED TRANSFORMERS"
        print(f"{i:3d}  {name:20s} {NOTES[name]}{flag}")
