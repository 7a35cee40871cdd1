"""What tests share: servers and CLI runs, built models, reference samplers, statistics, manifests.

Tests import helpers from here only, never from each other.
"""

from app.loading.paths import REPO_ROOT as ROOT

__all__ = ["ROOT"]
