"""SSH workers on the control plane: the pure ssh argv and remote scripts, one supervisor per worker,
the per-worker Unix-socket listener, the routes.
"""
