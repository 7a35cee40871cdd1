"""OpenAI's Responses API: its request as a chat request, the stored conversations, the answers and events."""
