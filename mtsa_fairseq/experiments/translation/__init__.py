"""Translation experiments: data preparation, seeds of fairseq-train, checkpoint averaging, BLEU."""
