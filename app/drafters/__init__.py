"""Drafters: what proposes tokens for the target to verify (draft model, prompt lookup, block drafters)."""
