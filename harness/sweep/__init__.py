"""Sweeps: the sweep file (spec), the plan of runs, launchers that execute it, and the live progress table."""
