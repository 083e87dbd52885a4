"""The values that cross a process edge: /ws/worker messages, the job a run process receives, device
sets, the S3 settings and keys. Imports only cdui.core.
"""
