"""The error a request raises when it reaches a bound the profile sets for one request.

Defined this low so that any layer can raise it (decoding, as a row's log-probabilities grow)
and the engine can tell it from an internal failure: it is the request's doing, answered as a
400 whose message names the limit and its profile key, never a 500.
"""

from __future__ import annotations


class RequestBoundError(Exception):
    """A request reached one of its bounds; the message names the limit and the profile key."""
