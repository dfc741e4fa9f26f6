"""Widgets of the live monitor; each takes frozen snapshot data and draws it."""
