"""simfog: a trace-driven simulator of data-parallel training, with a real-run validator beside it.

Importing simfog never imports torch.
"""

__version__ = "0.1.0"
