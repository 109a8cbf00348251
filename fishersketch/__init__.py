"""fishersketch."""
