"""Node declarations, the registry, and the built-in node library."""
