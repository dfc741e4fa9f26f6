"""trainwatch.tui: the Textual app, its widgets and styles, and the ``trainwatch`` CLI."""
