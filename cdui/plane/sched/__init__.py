"""Pure scheduling policy: where a run may go, what it waits for, whether a worker gets in. No I/O, no
store.
"""
