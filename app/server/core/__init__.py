"""The shared core of the HTTP layer: a validated request into rows, and rows into frames and bodies."""
