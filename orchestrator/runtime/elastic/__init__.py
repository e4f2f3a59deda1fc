"""The elastic runtime: the controller's ports on Ray, and the controller as a Ray actor.

See docs/controller.md ("On Ray") for the signals watched and how state moves.
"""
