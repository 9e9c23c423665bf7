"""Models as people export them: transformers and torch modules with seeded random weights (nothing downloaded),
exported by torch.onnx.export, cached under build/exports/.

    .venv/bin/python benchmarks/exports.py bert_base [--exporter dynamo|torchscript]   # writes and prints the path

Families (each a function returning the module and its example inputs, batch 1):
- bert_base, bert_large, distilbert: transformers' BertModel / DistilBertModel at bert-base-uncased,
  bert-large-uncased and distilbert-base-uncased sizes (vocabulary 30,522), seq 128, with input_ids,
  attention_mask (and token_type_ids for BERT), as the inf2 performance tables run them.
- resnet18, resnet50: ResNet at 224x224. torchvision cannot be imported beside the project's pinned CPU torch
  (its compiled operators do not load), so the module is built here layer for layer as torchvision defines
  resnet18 and resnet50 (v1.5: the stride on the bottleneck's 3x3 convolution; downsampling by a 1x1 convolution
  and batch norm), which exports the same ONNX operators; mobilenet_v3 likewise (MobileNetV3-Small).
- gpt2 (transformers' GPT2Model, 124M), llama_layer (one LlamaModel layer at TinyLlama's width: GQA, RoPE,
  RMSNorm, SwiGLU), vit (ViTModel base, 224x224): transformers, seq 128 for the text models.
- unet_block (a diffusion UNet's GroupNorm/SiLU ResNet block, 128 channels at 64x64) and scan (a gated running
  sum with torch.cumsum over 1,024 steps): small torch modules.

The exporter: "dynamo" is torch.onnx.export's default in torch 2.13 (opset 18, weights as external data);
"torchscript" its legacy path (dynamo=False, opset 17). Needs the [torch] extra (torch 2.13 CPU, transformers).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "build", "exports")
SEQ = 128
EXPORTERS = ("dynamo", "torchscript")


Builder = Callable[[], tuple[Any, dict[str, Any]]]  # a module and its example inputs, by name


def _bert(hidden: int, layers: int, heads: int, ffn: int) -> Builder:
    def build() -> tuple[Any, dict[str, Any]]:
        import torch
        from transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                            intermediate_size=ffn, max_position_embeddings=512)
        model = BertModel(config).eval()
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, config.vocab_size, (1, SEQ), generator=g)
        return model, {"input_ids": ids, "attention_mask": torch.ones(1, SEQ, dtype=torch.int64),
                       "token_type_ids": torch.zeros(1, SEQ, dtype=torch.int64)}
    return build


def _distilbert() -> tuple[Any, dict[str, Any]]:
    import torch
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072)
    model = DistilBertModel(config).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (1, SEQ), generator=g)
    return model, {"input_ids": ids, "attention_mask": torch.ones(1, SEQ, dtype=torch.int64)}


def _resnet(blocks: tuple[int, ...], bottleneck: bool) -> Builder:
    def build() -> tuple[Any, dict[str, Any]]:
        import torch
        from torch import nn

        expansion = 4 if bottleneck else 1

        class Block(nn.Module):
            def __init__(self, inplanes: int, planes: int, stride: int) -> None:
                super().__init__()
                if bottleneck:
                    shapes = [(inplanes, planes, 1, 1), (planes, planes, 3, stride), (planes, planes * 4, 1, 1)]
                else:
                    shapes = [(inplanes, planes, 3, stride), (planes, planes, 3, 1)]
                self.convs = nn.ModuleList(nn.Conv2d(i, o, k, s, k // 2, bias=False) for i, o, k, s in shapes)
                self.bns = nn.ModuleList(nn.BatchNorm2d(o) for _, o, _, _ in shapes)
                out = planes * expansion
                self.down = (nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                             if stride != 1 or inplanes != out else None)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                y = x
                for k, (conv, bn) in enumerate(zip(self.convs, self.bns)):
                    y = bn(conv(y))
                    if k < len(self.convs) - 1:
                        y = torch.relu(y)
                return torch.relu(y + (x if self.down is None else self.down(x)))

        class ResNet(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                          nn.MaxPool2d(3, 2, 1))
                layers, inplanes = [], 64
                for stage, count in enumerate(blocks):
                    planes = 64 << stage
                    for k in range(count):
                        layers.append(Block(inplanes, planes, 2 if k == 0 and stage > 0 else 1))
                        inplanes = planes * expansion
                self.layers = nn.Sequential(*layers)
                self.fc = nn.Linear(inplanes, 1000)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))

        torch.manual_seed(0)
        model = _trained_batch_norm(ResNet().eval())
        return model, {"x": torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))}
    return build


def _gpt2() -> tuple[Any, dict[str, Any]]:
    import torch
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257,
                        use_cache=False)  # a prefill without a cache object in its outputs
    model = GPT2Model(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "attention_mask": torch.ones(1, SEQ, dtype=torch.int64)}


def _llama_layer() -> tuple[Any, dict[str, Any]]:
    """One Llama-style decoder layer at TinyLlama's width (GQA 32 heads / 4 KV heads, RoPE, RMSNorm, SwiGLU),
    prefill of SEQ tokens."""
    import torch
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=1, num_attention_heads=32,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, use_cache=False)
    model = LlamaModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "attention_mask": torch.ones(1, SEQ, dtype=torch.int64)}


def _vit() -> tuple[Any, dict[str, Any]]:
    import torch
    from transformers import ViTConfig, ViTModel

    model = ViTModel(ViTConfig(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12,
                               num_attention_heads=12, intermediate_size=3072)).eval()
    return model, {"pixel_values": torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))}


def _mobilenet_v3() -> tuple[Any, dict[str, Any]]:
    """MobileNetV3-Small at 224x224, built block for block as its paper's table (and torchvision) gives it:
    inverted residuals with depthwise convolutions, squeeze-and-excitation, hardswish."""
    import torch
    from torch import nn

    def divisible(v: float) -> int:
        return max(8, int(v + 4) // 8 * 8)

    def conv_bn(cin: int, cout: int, k: int, s: int, groups: int, act: Any) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout),
                             *([act()] if act else []))

    class Block(nn.Module):
        def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, act: Any, s: int) -> None:
            super().__init__()
            layers = [] if exp == cin else [conv_bn(cin, exp, 1, 1, 1, act)]
            layers.append(conv_bn(exp, exp, k, s, exp, act))
            self.body = nn.Sequential(*layers)
            squeeze = divisible(exp / 4)
            self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(exp, squeeze, 1), nn.ReLU(),
                                    nn.Conv2d(squeeze, exp, 1), nn.Hardsigmoid()) if se else None
            self.project = conv_bn(exp, cout, 1, 1, 1, None)
            self.residual = s == 1 and cin == cout

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.body(x)
            if self.se is not None:
                y = y * self.se(y)
            y = self.project(y)
            return x + y if self.residual else y

    settings = [(3, 16, 16, True, nn.ReLU, 2), (3, 72, 24, False, nn.ReLU, 2), (3, 88, 24, False, nn.ReLU, 1),
                (5, 96, 40, True, nn.Hardswish, 2), (5, 240, 40, True, nn.Hardswish, 1),
                (5, 240, 40, True, nn.Hardswish, 1), (5, 120, 48, True, nn.Hardswish, 1),
                (5, 144, 48, True, nn.Hardswish, 1), (5, 288, 96, True, nn.Hardswish, 2),
                (5, 576, 96, True, nn.Hardswish, 1), (5, 576, 96, True, nn.Hardswish, 1)]
    torch.manual_seed(0)  # seeded before the first layer is built, so the weights are the same on every export
    blocks, cin = [conv_bn(3, 16, 3, 2, 1, nn.Hardswish)], 16
    for k, exp, cout, se, act, s in settings:
        blocks.append(Block(cin, k, exp, cout, se, act, s))
        cin = cout
    blocks.append(conv_bn(cin, 576, 1, 1, 1, nn.Hardswish))

    class MobileNetV3(nn.Module):  # a forward(x), as the example input is named (nn.Sequential's is `input`)
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(*blocks)
            self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, 1000))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    model = _trained_batch_norm(MobileNetV3().eval())
    return model, {"x": torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))}


def _unet_block() -> tuple[Any, dict[str, Any]]:
    """A diffusion UNet's ResNet block: GroupNorm(32) and SiLU before each 3x3 convolution, a skip connection;
    128 channels at 64x64 (torch exports GroupNorm as GroupNormalization)."""
    import torch
    from torch import nn

    class ResBlock(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.GroupNorm(32, channels), nn.GroupNorm(32, channels)
            self.conv1, self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1), nn.Conv2d(channels, channels, 3, 1, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.conv1(nn.functional.silu(self.norm1(x)))
            return x + self.conv2(nn.functional.silu(self.norm2(h)))

    torch.manual_seed(0)
    return ResBlock(128).eval(), {"x": torch.randn(1, 128, 64, 64, generator=torch.Generator().manual_seed(0))}


def _scan() -> tuple[Any, dict[str, Any]]:
    """A selective-scan-like layer written as people write it without a kernel: a gated projection and a running
    sum over the sequence (torch.cumsum), 1,024 steps of 256 channels."""
    import torch
    from torch import nn

    class Scan(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate, self.proj, self.out = nn.Linear(256, 256), nn.Linear(256, 256), nn.Linear(256, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.sigmoid(self.gate(x)) * self.proj(x)
            return self.out(torch.cumsum(h, dim=1))

    torch.manual_seed(0)
    return Scan().eval(), {"x": torch.randn(1, 1024, 256, generator=torch.Generator().manual_seed(0))}


def _trained_batch_norm(model: Any) -> Any:
    """Batch norm statistics that look trained, so that activations stay in range."""
    import torch
    from torch import nn

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


FAMILIES: dict[str, Builder] = {
    "bert_base": _bert(768, 12, 12, 3072),
    "bert_large": _bert(1024, 24, 16, 4096),
    "distilbert": _distilbert,
    "resnet18": _resnet((2, 2, 2, 2), bottleneck=False),
    "resnet50": _resnet((3, 4, 6, 3), bottleneck=True),
    "gpt2": _gpt2,
    "llama_layer": _llama_layer,
    "vit": _vit,
    "mobilenet_v3": _mobilenet_v3,
    "unet_block": _unet_block,
    "scan": _scan,
}


@dataclass(frozen=True)
class Registry:
    """Models to export by name, and how their cached files begin (build/exports/{prefix}{name}-{exporter}.onnx):
    the families here; benchmarks/architectures.py's small and large models."""
    builders: dict[str, Builder]
    prefix: str = ""


FAMILY_MODELS = Registry(FAMILIES)


def export(name: str, exporter: str = "dynamo", registry: Registry = FAMILY_MODELS) -> str:
    """The path of model `name` of `registry` (the families by default) exported by `exporter`, exporting it the
    first time (cached in build/exports/)."""
    models = registry.builders
    if name not in models or exporter not in EXPORTERS:
        raise ValueError(f"unknown model {name!r} or exporter {exporter!r}: models {', '.join(models)}; "
                         f"exporters {', '.join(EXPORTERS)}")
    path = os.path.join(CACHE, f"{registry.prefix}{name}-{exporter}.onnx")
    if os.path.exists(path):
        return path
    import torch

    os.makedirs(CACHE, exist_ok=True)
    model, inputs = models[name]()
    partial = path + ".partial"
    with torch.no_grad():
        if exporter == "dynamo":
            torch.onnx.export(model, (), partial, kwargs=inputs, input_names=list(inputs), dynamo=True,
                              external_data=True, verbose=False)
        else:  # the tracer passes inputs by position, which transformers 5's forward does not take: name them
            names = list(inputs)

            class Positional(torch.nn.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.model = model

                def forward(self, *args: torch.Tensor) -> Any:
                    out = self.model(**dict(zip(names, args)))
                    return out.to_tuple() if hasattr(out, "to_tuple") else out  # what the dynamo path returns

            torch.onnx.export(Positional().eval(), tuple(inputs.values()), partial, input_names=names,
                              dynamo=False, opset_version=17)
    _rename_with_data(partial, path)
    return path


def _rename_with_data(partial: str, path: str) -> None:
    """Move an exported model (and the external data file it names) to its cached name."""
    import onnx

    model = onnx.load(partial, load_external_data=False)
    data = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    if data:
        (location,) = data
        os.replace(os.path.join(os.path.dirname(partial), location), path + ".data")
        for t in model.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = os.path.basename(path) + ".data"
    onnx.save(model, path)
    os.remove(partial)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=list(FAMILIES))
    parser.add_argument("--exporter", choices=EXPORTERS, default="dynamo")
    args = parser.parse_args(argv)
    print(export(args.family, args.exporter))
    return 0


if __name__ == "__main__":
    sys.exit(main())
