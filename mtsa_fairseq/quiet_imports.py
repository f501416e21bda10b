"""Imported first by the package: fairseq's speech task logs "Please install tensorboardX" at INFO when it is
imported, a notice that text tasks never need; it is raised to WARNING before fairseq loads."""

import logging

logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
