"""The run directory: its file layout, bounded reads and the metrics writer, the one summary writer, and reading runs back."""
