"""Sweeps: the sweep file (spec), the plan of runs (plan), running them (run), launchers that execute each run, and the live progress table."""
