"""The model as a file: GGUF reading, architectures, loading, quant formats, the
tokenizer, chat templates, the catalogue and its fetcher."""
