"""Sentence-encoder experiments: data preparation, runs of the task configs, evaluation."""
