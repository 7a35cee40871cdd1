"""llama-server's native routes (/completion, /props, /slots, /tokenize, /health, ...), their requests and answers."""
