"""The harness command line: one module per command group, and main.py, which assembles them and maps errors to exit codes."""
