"""Tests of the examples under examples/ (the jobs as they run in their images)."""
