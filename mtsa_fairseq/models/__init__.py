"""fairseq models of the plugin. fairseq loads their checkpoints with ``torch.load(weights_only=True)``: the
classes those checkpoints pickle are allow-listed with the models (see ``checkpoint_safety``)."""

from ..checkpoint_safety import allow_fairseq_checkpoints

allow_fairseq_checkpoints()
