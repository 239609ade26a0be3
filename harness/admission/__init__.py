"""The admission gate: every check a run needs before any work, decided once (`harness.admission.gate.admit`)."""
