"""The controller: an explicit state machine that reaches the world only through ports."""
