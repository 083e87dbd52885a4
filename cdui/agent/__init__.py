"""The worker agent (`cdui agent start`): its connection loop, event spool, the files of a run on a
worker, one-shot lifecycle. Never imports cdui.plane.
"""
