"""The run directory: its file layout and atomic I/O, the budget vocabulary, the one summary writer, and reading runs back."""
