"""The control plane (`cdui start`): the aiohttp server, the run service, the worker manager and
sessions. Only the control-plane process loads this package.
"""
