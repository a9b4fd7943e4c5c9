"""The data shipped with simfog: the embedded default experiment, which `simfog simulate` and simfog.load run when
given no file (default.toml), and the catalogue of GPUs and networks `simfog plan` prices (catalogue.toml)."""

from pathlib import Path

DEFAULT_EXPERIMENT = Path(__file__).with_name("default.toml")
