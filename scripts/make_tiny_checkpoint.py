"""Write a small random-weight Llama checkpoint (Hugging Face format, with a BPE tokenizer) for demos and smoke runs.

Usage: python scripts/make_tiny_checkpoint.py OUT_DIR
The weights are random, so the text is gibberish; it exists only to show the machinery before a trained model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from longswift.bench.shapes import embedded_like

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity.\n"
) * 50


def main(out: Path) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [TEXT],
        trainers.BpeTrainer(
            vocab_size=512,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    cls_name, kwargs = embedded_like()  # bench/shapes.py: the embedded model's architecture, 512 tokens
    assert cls_name == "LlamaConfig"
    config = LlamaConfig(**kwargs)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
