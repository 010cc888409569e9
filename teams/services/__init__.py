"""Team services: roster, task board, protocol frames, liveness and idle, shutdown, gates, observers.

One module per concern; every state change is a keyword-only function named `<entity>_<verb>`.
"""
