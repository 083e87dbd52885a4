"""HTTP routes of the control plane: handlers translate HTTP into calls on the run service and worker
manager, nothing more.
"""
