"""GGUF models: SmolLM2 from the test data, and small files written with the gguf package."""
