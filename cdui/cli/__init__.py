"""The `cdui` command line and its HTTP client. The top layer: it may import every other package.
"""
