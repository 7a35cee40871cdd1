"""Embeddings: OpenAI's /v1/embeddings and llama-server's /embedding, their inputs and answers."""
