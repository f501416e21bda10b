"""Measurement helpers shared by the benchmark scripts."""
