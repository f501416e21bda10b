"""fairseq tasks of the plugin."""
