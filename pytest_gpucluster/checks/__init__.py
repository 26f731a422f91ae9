"""The verdict layer: what was measured, judged against the profile, as `results.model.Check` s."""
