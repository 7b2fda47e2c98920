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
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=131072,
        rope_theta=1e6,
        eos_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
