"""Running one graph: the run subprocess, its launcher and recorder, the zygote that forks warm run
processes, recorded outputs, the device probe and the node catalog helper. Used by the control plane
(local runs) and the agent; never imports cdui.plane or cdui.agent.
"""
