"""Tasks, data sets, answer extraction and grading, the verifier pool, pass@k / maj@k estimators and process-reward interfaces. Imports algorithms at most, never harness."""
