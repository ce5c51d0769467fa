"""Diagrams of the structures the lectures explain, drawn by code so they stay true.

One module per subject; each public ``draw_*`` function takes keyword parameters with
defaults and returns a :class:`matplotlib.figure.Figure` (the notebook shows it, and the
executed notebook keeps it as a PNG). Where a diagram can be computed from ddtk's own
code (a schedule, a ring's steps), it is, so the picture changes when the code does.
"""
