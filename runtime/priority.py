"""Priorities are integers: higher runs first. Two names cover the common case."""

BACKGROUND = 0
FOREGROUND = 10
