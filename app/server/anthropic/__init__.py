"""Anthropic's Messages API: its request as a chat request, its answers and events."""
