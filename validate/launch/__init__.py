"""Launchers: starting every rank of a real run, bounded in time (launcher: simfog's own, in the emulated nodes;
torchrun: torchrun agents and Slurm's srun)."""
