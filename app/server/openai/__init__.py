"""OpenAI's chat and text completions and its model list: routes, requests and answers."""
