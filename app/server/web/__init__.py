"""The chat page at `/`: index.html and its icon, shipped in the package, and the routes that serve them."""
