"""fairseq criterions of the plugin."""
