"""atlas."""
