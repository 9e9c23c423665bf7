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
  and batch norm), which exports the same ONNX operators.

The exporter: "dynamo" is torch.onnx.export's default in torch 2.13 (opset 18, weights as external data);
"torchscript" its legacy path (dynamo=False, opset 17). Needs the [torch] extra (torch 2.13 CPU, transformers).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "build", "exports")
SEQ = 128
EXPORTERS = ("dynamo", "torchscript")


def _bert(hidden: int, layers: int, heads: int, ffn: int) -> Callable[[], tuple[Any, dict[str, Any]]]:
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


def _resnet(blocks: tuple[int, ...], bottleneck: bool) -> Callable[[], tuple[Any, dict[str, Any]]]:
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
        model = ResNet().eval()
        with torch.no_grad():  # trained-looking batch norm statistics, so activations stay in range
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.1, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
        return model, {"x": torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))}
    return build


FAMILIES: dict[str, Callable[[], tuple[Any, dict[str, Any]]]] = {
    "bert_base": _bert(768, 12, 12, 3072),
    "bert_large": _bert(1024, 24, 16, 4096),
    "distilbert": _distilbert,
    "resnet18": _resnet((2, 2, 2, 2), bottleneck=False),
    "resnet50": _resnet((3, 4, 6, 3), bottleneck=True),
}


def export(name: str, exporter: str = "dynamo") -> str:
    """The path of `name` exported by `exporter`, exporting it the first time (cached in build/exports/)."""
    if name not in FAMILIES or exporter not in EXPORTERS:
        raise ValueError(f"unknown family {name!r} or exporter {exporter!r}: families {', '.join(FAMILIES)}; "
                         f"exporters {', '.join(EXPORTERS)}")
    path = os.path.join(CACHE, f"{name}-{exporter}.onnx")
    if os.path.exists(path):
        return path
    import torch

    os.makedirs(CACHE, exist_ok=True)
    model, inputs = FAMILIES[name]()
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
