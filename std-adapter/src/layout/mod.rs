//! Reading KV layouts: the JSON layout file, Hugging Face `config.json`, built-in presets.
