"""Ollama's API: its requests as the chat pipeline's, its answers (NDJSON lines), its model listings."""
