"""Architectures beyond the issue's families (benchmarks/exports.py): text encoders, decoders, vision and speech
models as transformers defines them, with seeded random weights, exported by both of torch.onnx.export's exporters.

    .venv/bin/python benchmarks/architectures.py [NAME ...] [--exporter E] [--cast bf16|fp32] [--json OUT]
    .venv/bin/python benchmarks/architectures.py --check [NAME ...] [--exporter E]

Without --check: the realistic sizes (LARGE: ConvNeXt-T, EfficientNet-B0, MobileNetV2, Swin-T at 224x224, ALBERT-base
and T5-small's encoder at seq 128) timed against their rooflines on trn1, as benchmarks/families.py times the
families. With --check: every architecture at a small size (SMALL: two layers of hidden 128, or the like) compiled,
run on the simulated chip and compared with onnxruntime, in fp32 (check's rtol 1e-3, atol 1e-4) and with
--auto-cast matmult (the documented bound, or within 2x of the cast's own error where the model itself does not
take bf16: `neuronx-cc-lite check`'s note); a row per model and cast, and a non-zero exit if any fails.
tests/test_architectures.py (slow tier) runs the check for each.

Weights are transformers' initialisation, seeded; batch norms get statistics and affine parameters that look
trained (transformers initialises some of them to zero, which leaves an EfficientNet's output all zeros).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.exports import EXPORTERS, Builder, Registry, _trained_batch_norm, export  # noqa: E402

SEQ_SMALL, SEQ = 32, 128


def _text(vocab: int, seq: int, types: bool = False) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    found = {"input_ids": torch.randint(3, vocab, (1, seq), generator=g),
             "attention_mask": torch.ones(1, seq, dtype=torch.int64)}
    if types:
        found["token_type_ids"] = torch.zeros(1, seq, dtype=torch.int64)
    return found


def _image(size: int, channels: int = 3) -> dict[str, Any]:
    import torch

    return {"pixel_values": torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(0))}


def _healthy(model: Any) -> Any:
    """Batch norms with trained-looking statistics and affine parameters (scale 0.5 to 1.5, shift within 0.2).
    LeViT's one-dimensional ones too: transformers zero-initialises the last of each residual branch, which left
    its outputs at 4e-4, too small to tell a working network from a dead one."""
    import torch

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                if isinstance(m, torch.nn.BatchNorm1d):
                    m.running_mean.uniform_(-0.1, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
    return _trained_batch_norm(model)


def _hf(model_class: str, config_class: str, inputs: Callable[[], dict[str, Any]], **config: Any) -> Builder:
    """transformers' `model_class` over `config_class(**config)`, seeded, in eval mode, with `inputs()`."""
    def build() -> tuple[Any, dict[str, Any]]:
        import torch
        import transformers

        torch.manual_seed(0)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
        return _healthy(model.eval()), inputs()
    return build


def _encoder_of(model_class: str, config_class: str, inputs: Callable[[], dict[str, Any]], **config: Any) -> Builder:
    """The encoder of an encoder-decoder model (Whisper's, BART's), as people export it for feature extraction."""
    whole = _hf(model_class, config_class, inputs, **config)

    def build() -> tuple[Any, dict[str, Any]]:
        model, found = whole()
        return model.get_encoder().eval(), found
    return build


def _small_text(types: bool = False) -> Callable[[], dict[str, Any]]:
    return lambda: _text(1000, SEQ_SMALL, types)


def _small_image() -> dict[str, Any]:
    return _image(64)


H = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)
D = dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, use_cache=False)

# Small configurations: what the exporters emit for each architecture, checked against onnxruntime
SMALL: dict[str, Builder] = {
    "roberta": _hf("RobertaModel", "RobertaConfig", _small_text(), vocab_size=1000, **H),
    "albert": _hf("AlbertModel", "AlbertConfig", _small_text(types=True), vocab_size=1000, embedding_size=64, **H),
    "electra": _hf("ElectraModel", "ElectraConfig", _small_text(types=True), vocab_size=1000, embedding_size=64,
                   **H),
    "deberta_v2": _hf("DebertaV2Model", "DebertaV2Config", _small_text(), vocab_size=1000, **H),
    "mpnet": _hf("MPNetModel", "MPNetConfig", _small_text(), vocab_size=1000, **H),
    "mobilebert": _hf("MobileBertModel", "MobileBertConfig", _small_text(), vocab_size=1000, hidden_size=128,
                      num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, intra_bottleneck_size=64,
                      embedding_size=64, true_hidden_size=64),
    "t5_encoder": _hf("T5EncoderModel", "T5Config", _small_text(), vocab_size=1000, d_model=128, d_kv=32, d_ff=256,
                      num_layers=2, num_heads=4),
    "bart_encoder": _encoder_of("BartModel", "BartConfig", _small_text(), vocab_size=1000, d_model=128,
                                encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                                decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256),
    "clip_text": _hf("CLIPTextModel", "CLIPTextConfig", _small_text(), vocab_size=1000, max_position_embeddings=64,
                     **H),
    "funnel": _hf("FunnelBaseModel", "FunnelConfig", _small_text(types=True), vocab_size=1000, block_sizes=[1, 1],
                  d_model=128, n_head=4, d_head=32, d_inner=256),
    "convbert": _hf("ConvBertModel", "ConvBertConfig", _small_text(types=True), vocab_size=1000, embedding_size=128,
                    **H),
    "squeezebert": _hf("SqueezeBertModel", "SqueezeBertConfig", _small_text(), vocab_size=1000, embedding_size=128,
                       **H),
    "roformer": _hf("RoFormerModel", "RoFormerConfig", _small_text(), vocab_size=1000, embedding_size=128, **H),
    "layoutlm": _hf("LayoutLMModel", "LayoutLMConfig", _small_text(), vocab_size=1000, **H),
    "rembert": _hf("RemBertModel", "RemBertConfig", _small_text(), vocab_size=1000, input_embedding_size=64,
                   output_embedding_size=64, **H),
    "esm": _hf("EsmModel", "EsmConfig", lambda: _text(30, SEQ_SMALL), vocab_size=33, pad_token_id=1,
               mask_token_id=32, position_embedding_type="rotary", **H),
    "gpt2": _hf("GPT2Model", "GPT2Config", _small_text(), vocab_size=1000, n_embd=128, n_layer=2, n_head=4,
                n_positions=64, use_cache=False),
    "gpt_neo": _hf("GPTNeoModel", "GPTNeoConfig", _small_text(), vocab_size=1000, hidden_size=128, num_layers=2,
                   num_heads=4, attention_types=[[["global", "local"], 1]], window_size=16, use_cache=False),
    "gptj": _hf("GPTJModel", "GPTJConfig", _small_text(), vocab_size=1000, n_embd=128, n_layer=2, n_head=4,
                rotary_dim=16, use_cache=False),
    "opt": _hf("OPTModel", "OPTConfig", _small_text(), ffn_dim=256, word_embed_proj_dim=128, **D),
    "bloom": _hf("BloomModel", "BloomConfig", _small_text(), vocab_size=1000, hidden_size=128, n_layer=2, n_head=4,
                 use_cache=False),
    "falcon": _hf("FalconModel", "FalconConfig", _small_text(), **D),
    "llama": _hf("LlamaModel", "LlamaConfig", _small_text(), num_key_value_heads=2, intermediate_size=256, **D),
    "mistral": _hf("MistralModel", "MistralConfig", _small_text(), num_key_value_heads=2, intermediate_size=256,
                   **D),
    "qwen2": _hf("Qwen2Model", "Qwen2Config", _small_text(), num_key_value_heads=2, intermediate_size=256, **D),
    "phi": _hf("PhiModel", "PhiConfig", _small_text(), intermediate_size=256, **D),
    "gemma": _hf("GemmaModel", "GemmaConfig", _small_text(), num_key_value_heads=1, intermediate_size=256,
                 head_dim=32, **D),
    "gpt_neox": _hf("GPTNeoXModel", "GPTNeoXConfig", _small_text(), intermediate_size=256, **D),
    "gpt_bigcode": _hf("GPTBigCodeModel", "GPTBigCodeConfig", _small_text(), vocab_size=1000, n_embd=128, n_layer=2,
                       n_head=4, n_positions=64, use_cache=False),
    "codegen": _hf("CodeGenModel", "CodeGenConfig", _small_text(), vocab_size=1000, n_embd=128, n_layer=2, n_head=4,
                   rotary_dim=16, n_positions=64, n_ctx=64, use_cache=False),
    "biogpt": _hf("BioGptModel", "BioGptConfig", _small_text(), intermediate_size=256, **D),
    "stablelm": _hf("StableLmModel", "StableLmConfig", _small_text(), num_key_value_heads=2, intermediate_size=256,
                    **D),
    "phi3": _hf("Phi3Model", "Phi3Config", _small_text(), num_key_value_heads=2, intermediate_size=256,
                pad_token_id=0, **D),
    "olmo": _hf("OlmoModel", "OlmoConfig", _small_text(), intermediate_size=256, pad_token_id=0, **D),
    "starcoder2": _hf("Starcoder2Model", "Starcoder2Config", _small_text(), num_key_value_heads=2,
                      intermediate_size=256, **D),
    "deit": _hf("DeiTModel", "DeiTConfig", _small_image, image_size=64, patch_size=16, **H),
    "beit": _hf("BeitModel", "BeitConfig", _small_image, image_size=64, patch_size=16,
                use_relative_position_bias=True, **H),
    "dinov2": _hf("Dinov2Model", "Dinov2Config", _small_image, image_size=64, patch_size=16, **H),
    "clip_vision": _hf("CLIPVisionModel", "CLIPVisionConfig", _small_image, image_size=64, patch_size=16, **H),
    "yolos": _hf("YolosModel", "YolosConfig", _small_image, image_size=[64, 64], patch_size=16,
                 num_detection_tokens=10, **H),
    "dpt": _hf("DPTModel", "DPTConfig", _small_image, image_size=64, patch_size=16, backbone_out_indices=[0, 1],
               neck_hidden_sizes=[32, 64], reassemble_factors=[4, 2], **H),
    "focalnet": _hf("FocalNetModel", "FocalNetConfig", _small_image, image_size=64, embed_dim=32, depths=[1, 1],
                    focal_levels=[2, 2], focal_windows=[3, 3]),
    "swin": _hf("SwinModel", "SwinConfig", _small_image, image_size=64, patch_size=4, embed_dim=32, depths=[1, 1],
                num_heads=[2, 4], window_size=4),
    "convnext": _hf("ConvNextModel", "ConvNextConfig", _small_image, num_stages=2, hidden_sizes=[32, 64],
                    depths=[1, 1], image_size=64),
    "resnet": _hf("ResNetModel", "ResNetConfig", _small_image, embedding_size=32, hidden_sizes=[32, 64],
                  depths=[1, 1], layer_type="bottleneck"),
    "regnet": _hf("RegNetModel", "RegNetConfig", _small_image, embedding_size=16, hidden_sizes=[32, 64],
                  depths=[1, 1], groups_width=8),
    "mobilenet_v2": _hf("MobileNetV2Model", "MobileNetV2Config", _small_image, image_size=64, depth_multiplier=0.35),
    "efficientnet": _hf("EfficientNetModel", "EfficientNetConfig", _small_image, image_size=64,
                        width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280),  # (B0's; the default is B7)
    "mobilevit": _hf("MobileViTModel", "MobileViTConfig", _small_image, image_size=64, hidden_sizes=[48, 64, 80],
                     neck_hidden_sizes=[16, 16, 24, 24, 32, 32, 128]),
    "levit": _hf("LevitModel", "LevitConfig", _small_image, image_size=64, hidden_sizes=[64, 96, 128],
                 num_attention_heads=[2, 3, 4], depths=[1, 1, 1], key_dim=[16, 16, 16]),
    "poolformer": _hf("PoolFormerModel", "PoolFormerConfig", _small_image, hidden_sizes=[32, 64], depths=[1, 1],
                      num_encoder_blocks=2, patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1]),
    "segformer": _hf("SegformerModel", "SegformerConfig", _small_image, num_encoder_blocks=2, depths=[1, 1],
                     sr_ratios=[2, 1], hidden_sizes=[32, 64], num_attention_heads=[1, 2], patch_sizes=[7, 3],
                     strides=[4, 2], mlp_ratios=[2, 2]),
    "glpn": _hf("GLPNModel", "GLPNConfig", _small_image, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                hidden_sizes=[32, 64], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2],
                mlp_ratios=[2, 2]),
    "whisper_encoder": _encoder_of("WhisperModel", "WhisperConfig", lambda: _features(16, 64), vocab_size=1000,
                                   d_model=128, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                                   decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
                                   num_mel_bins=16, max_source_positions=32, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2, decoder_start_token_id=1),
    "wav2vec2": _hf("Wav2Vec2Model", "Wav2Vec2Config", lambda: _audio(1600), conv_dim=[32, 32], conv_stride=[5, 2],
                    conv_kernel=[10, 3], num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **H),
    "hubert": _hf("HubertModel", "HubertConfig", lambda: _audio(1600), conv_dim=[32, 32], conv_stride=[5, 2],
                  conv_kernel=[10, 3], num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **H),
}

# Realistic sizes, timed against their rooflines (ALBERT-base: AWS publishes 0.937 ms for it on inf2)
LARGE: dict[str, Builder] = {
    "albert_base": _hf("AlbertModel", "AlbertConfig", lambda: _text(30000, SEQ, types=True), vocab_size=30000,
                       embedding_size=128, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       intermediate_size=3072),
    "t5_small_encoder": _hf("T5EncoderModel", "T5Config", lambda: _text(32000, SEQ), vocab_size=32128, d_model=512,
                            d_kv=64, d_ff=2048, num_layers=6, num_heads=8),
    "convnext_tiny": _hf("ConvNextModel", "ConvNextConfig", lambda: _image(224)),
    "efficientnet_b0": _hf("EfficientNetModel", "EfficientNetConfig", lambda: _image(224), image_size=224,
                           width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280),
    "mobilenet_v2_hf": _hf("MobileNetV2Model", "MobileNetV2Config", lambda: _image(224)),
    "swin_tiny": _hf("SwinModel", "SwinConfig", lambda: _image(224)),
}


SMALL_MODELS, LARGE_MODELS = Registry(SMALL, "small-"), Registry(LARGE, "large-")


def _features(bins: int, frames: int) -> dict[str, Any]:
    import torch

    return {"input_features": torch.randn(1, bins, frames, generator=torch.Generator().manual_seed(0))}


def _audio(samples: int) -> dict[str, Any]:
    import torch

    return {"input_values": torch.randn(1, samples, generator=torch.Generator().manual_seed(0))}


def check(name: str, exporter: str, cast: str) -> dict[str, Any]:
    """SMALL[name] exported, compiled (fp32, or auto-cast matmult to bf16), run on the simulated chip with the
    export's own example inputs, and compared with onnxruntime as `neuronx-cc-lite check` compares."""
    import numpy as np
    import onnx

    import neuronx_cc_lite
    import runtime
    from neuronx_cc_lite.precision import error_bound, the_casts_own
    from neuronx_cc_lite.reference import cast_only_model, error_over_rms, onnxruntime_outputs, within

    path = export(name, exporter, SMALL_MODELS)
    model = onnx.load(path)
    _, example = SMALL[name]()
    names = [i.name for i in model.graph.input]
    inputs = {k: v.numpy() for k, v in example.items() if k in names}
    auto = {"auto_cast": "matmult", "auto_cast_type": "bf16"} if cast == "bf16" else {}
    ours = runtime.load(neuronx_cc_lite.compile(path, cache=False, **auto)).run(inputs)
    ref = onnxruntime_outputs(model, inputs)
    bound = error_bound("matmult", "bf16") if cast == "bf16" else None
    own = onnxruntime_outputs(cast_only_model(model, "matmult", "bf16"), inputs, optimize=False) if bound else {}
    row: dict[str, Any] = {"name": name, "exporter": exporter, "cast": cast, "outputs": {}}
    ok = True
    for out, expected in ref.items():
        err = error_over_rms(ours[out], expected)
        if bound is None:
            good, verdict = within(ours[out], expected, 1e-3, 1e-4), ""
        else:
            cast_err = error_over_rms(own[out], expected) if expected.dtype.kind == "f" else 0.0
            good = err <= bound or the_casts_own(err, cast_err, bound)
            verdict = f" (cast's own {cast_err:.2e})" if err > bound else ""
        row["outputs"][out] = f"{err:.2e}{verdict}"
        ok &= bool(good)
    row["ok"] = ok
    row["values"] = float(max((np.abs(v).max() for v in ref.values() if v.dtype.kind == "f"), default=0.0))
    return row


def main(argv: list[str] | None = None) -> int:
    if "--check" not in (argv if argv is not None else sys.argv[1:]):
        from benchmarks.families import main as table

        return table(argv, LARGE_MODELS, __doc__.split("\n\n")[0])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", required=True)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"models: {', '.join(SMALL)} (all by default)")
    parser.add_argument("--exporter", choices=EXPORTERS, action="append", help="both by default")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in SMALL]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(SMALL)}")
    failed = 0
    for name in args.names or SMALL:
        for exporter in args.exporter or EXPORTERS:
            for cast in ("fp32", "bf16"):
                row = check(name, exporter, cast)
                failed += not row["ok"]
                errors = ", ".join(f"{k} {v}" for k, v in row["outputs"].items())
                print(f"{name:<16} {exporter:<12} {cast:<5} {'ok' if row['ok'] else 'MISMATCH':<9} err/rms: {errors}",
                      flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
