"""Rebuild of the default model embedded in longswift (corpus, tokenizer, base model, model card)."""
