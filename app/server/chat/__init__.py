"""The chat pipeline every chat-shaped API runs through: the chat request, its template, tools and thinking."""
