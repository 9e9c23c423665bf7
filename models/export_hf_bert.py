"""Export a transformers-5 BERT as people do: `torch.onnx.export(model, (input_ids, attention_mask), path)` with
every other argument at its default (torch 2.13: the dynamo exporter, opset 18, weights as external data beside
the model). The model is built from a small config with seeded random weights (no download).

    pip install transformers    # 5.x; torch and onnxscript come with the project's [torch] extra
    python models/export_hf_bert.py    # writes models/bert_hf.onnx and models/bert_hf.onnx.data

Not rerun by the tests (transformers is not a dependency of the project, and the exporter's output is not stable
byte for byte across versions); tests/compiler/test_models.py checks that the files it names are committed.
Exported with transformers 5.24.0 and torch 2.13.0+cpu.
"""

from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))
EXPORTS = ["bert_hf"]  # the models this script writes


def export() -> None:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=32)
    model = BertModel(config).eval()
    input_ids = torch.randint(0, config.vocab_size, (2, 16))
    attention_mask = torch.ones(2, 16, dtype=torch.int64)
    attention_mask[1, 12:] = 0
    torch.onnx.export(model, (input_ids, attention_mask), os.path.join(HERE, "bert_hf.onnx"))


if __name__ == "__main__":
    export()
