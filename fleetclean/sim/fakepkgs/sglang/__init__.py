"""A stand-in for the SGLang package, run inside simulated nodes.

Only ``python3 -m sglang.launch_server`` exists: it looks and dies like the real server
(see ``launch_server``) and computes nothing.
"""
